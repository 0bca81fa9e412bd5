"""params.yaml loading: the shipped file is valid, and every kind of bad value names its key."""

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.support.shipped import SHIPPED_FROM
from thermal2visible.config.load import load_params, preset_overrides
from thermal2visible.config.schema import SECTIONS
from thermal2visible.config.stored import marked, stored_section, weight_defining
from thermal2visible.errors import ConfigError
from thermal2visible.models.networks import check_networks
from thermal2visible.dvc_experiment import dvc_command

REPO_PARAMS = SHIPPED_FROM


def test_shipped_params_load_and_flatten():
    params = load_params(REPO_PARAMS)
    flat = params.flat("train", "early_stop")
    assert flat["train.batch_size"] == params.train.batch_size
    assert "early_stop.window" in flat and not any(key.startswith("model.") for key in flat)
    # a mapping as one param, its JSON text: a logger spreads a dict into keys, or drops an empty one
    assert json.loads(params.flat("model")["model.generator_settings"]) == params.model.generator_settings


def test_a_params_file_from_before_the_networks_had_settings_reads_as_today(tmp_path):
    """model.ngf, ndf, norm, dropout and discriminator_scales moved into the networks' settings: a params.yaml,
    preset or override of the old form says what it said, and an old key wins (an override is the newer word)."""
    raw = yaml.safe_load(REPO_PARAMS.read_text())
    generator, discriminator = raw["model"].pop("generator_settings"), raw["model"].pop("discriminator_settings")
    raw["model"] |= {key: generator[key] for key in ("ngf", "norm", "dropout")}
    raw["model"] |= {"ndf": discriminator["ndf"], "discriminator_scales": discriminator["scales"]}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    assert load_params(tmp_path / "params.yaml") == load_params(REPO_PARAMS)
    overridden = load_params(REPO_PARAMS, ["model.ngf=64", "model.discriminator_scales=2"]).model
    assert overridden.generator_settings["ngf"] == 64 and overridden.discriminator_settings["scales"] == 2


def test_override_is_parsed_as_yaml():
    params = load_params(REPO_PARAMS, ["train.batch_size=64", "preprocess.percentiles=[2, 98]"])
    assert params.train.batch_size == 64
    assert params.preprocess.percentiles == (2.0, 98.0)
    for value, read in [("auto", "auto"), ("true", True), ("false", False)]:  # a word or a bool
        assert load_params(REPO_PARAMS, [f"train.channels_last={value}"]).train.channels_last == read


@pytest.mark.parametrize(
    "override, named",
    [
        ("train.batch_sise=4", "train.batch_sise: unknown key"),
        ("trian.batch_size=4", "trian: unknown section"),
        ("train.precision=16", "train.precision"),
        ("train.batch_size=two", "train.batch_size: expected an integer"),
        ("train.channels_last=1", "train.channels_last: expected auto or true or false, got 1"),
        ("preprocess.percentiles=[99, 1]", "preprocess.percentiles"),
        ("preprocess.val_fraction=0.9", "preprocess.test_fraction: 0.15 + val_fraction 0.9 must be < 1"),
        ("preprocess.fixed_range=[5, 5]", "preprocess.fixed_range: [5.0, 5.0] must be finite and increasing"),
        (
            "preprocess.fixed_range=[-1.0e+308, 1.0e+308]",
            "fixed_range: [-1e+308, 1e+308] must be finite and increasing",
        ),
        (
            "preprocess.fixed_range=[0, 0.5]",
            "preprocess.fixed_range: [0.0, 0.5] must be finite and increasing, at least 1",
        ),
        ("preprocess.fixed_range=[-10, 100]", "preprocess.fixed_range: [-10.0, 100.0] must lie within the counts"),
        ("preprocess.temperature_range=[30, 30.01]", "preprocess.temperature_range: [30.0, 30.01] must be finite"),
        (
            "preprocess.percentiles=[0, 1.0e-300]",
            "preprocess.percentiles: [0.0, 1e-300] must be increasing within [0, 100], at least 1 apart",
        ),
        ("serve.max_run_seconds=0", "serve.max_run_seconds: 0 must be > 0"),
        ("preprocess.image_size=-64", "preprocess.image_size: -64 must be >= 16"),
        ("train.batch_size=3", "train.batch_size: 3 is not divisible"),
        ("serve.max_model_pixels=4000", "serve.max_model_pixels: 4000 is less than one 64x64 training square"),
        ("train", "expected section.key=value"),
        ("train.lambda_feat=-1", "train.lambda_feat: -1 must be >= 0"),
        ("train.small_convs_as_matmul=-1", "train.small_convs_as_matmul: -1 must be >= 0"),
    ],
)
def test_bad_values_name_their_key(override, named):
    overrides = [override] if override != "train.batch_size=3" else [override, "train.devices=2"]
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_params(REPO_PARAMS, overrides)


@pytest.mark.parametrize(
    "overrides, refusal",
    [
        (["preprocess.image_size=48"], "preprocess.image_size: 48 must be a power of two >= 16 (the U-Net"),
        (["preprocess.image_size=48", "model.generator=resnet"], None),
        (
            ["preprocess.image_size=50", "model.generator=resnet"],
            "preprocess.image_size: 50 must be a multiple of 4 >= 16",
        ),
        (["preprocess.image_size=32", "model.discriminator_settings.scales=2"], None),
        (
            ["preprocess.image_size=32", "model.discriminator_settings.scales=3"],
            "preprocess.image_size: 32 px in 3 scales .*discriminator_settings.scales.* leaves the coarsest at 8 px, "
            "under the 16 px a PatchGAN needs",
        ),
    ],
)
def test_the_generator_and_discriminator_scales_fit_the_image_size(overrides, refusal):
    """Each network's size rule is its own module's, checked where it is built."""

    def check() -> None:
        params = load_params(REPO_PARAMS, overrides)
        check_networks(params.model, params.preprocess.image_size)

    if refusal is None:
        check()
    else:
        with pytest.raises(ConfigError, match=refusal.replace("(", r"\(")):
            check()


@pytest.mark.parametrize(
    "override, refusal",
    [
        ("model.generator=vae", "model.generator: 'vae' is not one of ['resnet', 'unet']"),
        ("model.discriminator=critic", "model.discriminator: 'critic' is not one of ['patchgan']"),
        (
            "model.generator_settings.depth=4",
            "model.generator_settings.depth: unknown key (known keys: dropout, ngf, norm)",
        ),
        ("model.discriminator_settings.depth=4", "model.discriminator_settings.depth: unknown key (known keys:"),
        (
            "model.generator_settings.dropout=1",
            "model.generator_settings.dropout: 1 must be < 1 (model.generator: unet)",
        ),
        ("model.discriminator_settings.scales=4", "model.discriminator_settings.scales: 4 is not one of [1, 2, 3]"),
    ],
)
def test_a_network_kind_or_setting_that_is_not_there_is_named(override, refusal):
    params = load_params(REPO_PARAMS, [override])
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        check_networks(params.model, params.preprocess.image_size)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="no such params file"):
        load_params(tmp_path / "absent.yaml")
    bad = tmp_path / "params.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(bad)


@pytest.mark.parametrize("preset", sorted(Path("params").glob("*.yaml")), ids=lambda path: path.stem)
def test_every_preset_loads_and_changes_what_it_names(preset):
    raw = yaml.safe_load(preset.read_text())
    params = load_params(REPO_PARAMS, preset_overrides(preset))
    for section, keys in raw.items():
        for key, value in keys.items():
            loaded = getattr(getattr(params, section), key)
            if isinstance(value, dict):  # laid over params.yaml's mapping key by key
                loaded = {inner: loaded[inner] for inner in value}
            assert list(loaded) == value if isinstance(loaded, tuple) else loaded == value, f"{section}.{key}"


def test_a_preset_survives_a_shell_split_as_dvc_exp_run_settings():
    """thermal2visible.dvc_experiment takes settings as one space-separated string (MLproject's `set`): a preset's
    settings must split back into the same ones."""
    settings = preset_overrides("params/paper_gpu.yaml")
    command = dvc_command("all", " ".join(settings).split())
    assert command[:3] == ["dvc", "exp", "run"] and command[3::2] == ["-S"] * len(settings)
    preset = load_params(REPO_PARAMS, settings)
    assert load_params(REPO_PARAMS, command[4::2]) == preset and preset.train.precision == "16-mixed"


def test_a_preset_that_is_not_sections_of_keys_is_refused(tmp_path):
    (tmp_path / "flat.yaml").write_text("batch_size: 4\n")
    with pytest.raises(ConfigError, match="flat.yaml: expected sections"):
        preset_overrides(tmp_path / "flat.yaml")


def test_the_schema_holds_no_values_and_a_key_missing_from_params_yaml_is_named(tmp_path):
    """params.yaml is the one source of values: the schema declares none, so nothing can silently differ from it."""
    with_values = [
        f"{section}.{key.name}"
        for section, kind in SECTIONS.items()
        for key in dataclasses.fields(kind)
        if key.default is not dataclasses.MISSING or key.default_factory is not dataclasses.MISSING
    ]
    assert not with_values
    raw = yaml.safe_load(Path(REPO_PARAMS).read_text())
    del raw["train"]["lr_d"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"train.lr_d: missing \(params.yaml holds a value for every key"):
        load_params(tmp_path / "params.yaml")
    del raw["preprocess"]["percentiles"]  # a list-valued key: missing, not a malformed list
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"preprocess.percentiles: missing \(params.yaml holds"):
        load_params(tmp_path / "params.yaml")


def test_a_section_training_reads_marks_every_key_and_dvc_gives_train_every_weight_key():
    """The marks are the one classing of keys: a section has them on every key or on none, and each key marked
    defines_weights() reaches the train stage as a DVC param (its own, or one of the stage that makes its cache)."""
    for section in SECTIONS:
        assert len(marked(section, "weights")) in (0, len(dataclasses.fields(SECTIONS[section]))), section
    stages = yaml.safe_load(Path("dvc.yaml").read_text())["stages"]
    given = {param for stage in ("preprocess", "train") for param in stages[stage]["params"]}
    missing = [
        f"{section}.{key}"
        for section, keys in weight_defining().items()
        for key in keys
        if section not in given and f"{section}.{key}" not in given
    ]
    assert weight_defining()["train"] and not missing


def test_stored_settings_are_upgraded_in_one_place():
    """A key added after models were stored reads as the value they were made with; another missing key is named."""
    model = load_params(REPO_PARAMS).model
    generator, discriminator = model.generator_settings, model.discriminator_settings
    # as the first models stored it: no generator (all were U-Nets), one norm for both networks, a single scale
    stored = {key: generator[key] for key in ("ngf", "norm", "dropout")} | {"ndf": discriminator["ndf"]}
    assert stored_section("model", stored | {"recompute": model.recompute}) == load_params(REPO_PARAMS).model
    preprocess = json.loads(json.dumps(dataclasses.asdict(load_params(REPO_PARAMS).preprocess)))
    assert stored_section("preprocess", preprocess) == load_params(REPO_PARAMS).preprocess
    del preprocess["align"]
    with pytest.raises(ConfigError, match="stored preprocess.align: missing"):
        stored_section("preprocess", preprocess)
