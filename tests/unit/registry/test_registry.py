"""Registry through a real `mlflow server`: new versions, lineage tags, and the champion gate."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import base64

import mlflow
import mlflow.pyfunc
import onnx
import pytest
from tests.support.corpus import png, rgb, temperatures, thermal16, tiff
from mlflow import MlflowClient
from tests.support.shipped import SHIPPED, SHIPPED_FROM, shipped
from thermal2visible.paths import EVAL_METRICS, MANIFEST
from tests.support.tiny_model import export_tiny, write_stage_record

from thermal2visible.config.load import load_params
from thermal2visible.data.cache import build_cache
from thermal2visible.data.images import decode_image
from thermal2visible.data.ingest import ingest
from thermal2visible.errors import PipelineError
from thermal2visible.registry.descriptions import served_from
from thermal2visible.registry.gate import CANDIDATE, CHALLENGER, CHAMPION, gate, register
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.serving import IMAGE
from thermal2visible.registry.packing import pyfunc_arguments

ROOT = Path(__file__).resolve().parents[3]
REGISTER = ROOT / "pipelines" / "register.py"


@pytest.fixture
def client(tracking_uri, monkeypatch) -> MlflowClient:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    return MlflowClient(tracking_uri)


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory, tiny_cache) -> Path:
    return export_tiny(tmp_path_factory.mktemp("model"), tiny_cache)


@pytest.mark.parametrize(
    "psnr, parity, champion, expected",
    [
        (20.0, True, None, CHAMPION),  # the first model that passes parity
        (20.0, False, None, CHALLENGER),  # failed parity never becomes champion
        (20.0, True, 20.0, CHAMPION),  # a tie moves the champion to the newer model
        (19.9, True, 20.0, CHALLENGER),
        (30.0, False, 20.0, CHALLENGER),
    ],
)
def test_gate(psnr, parity, champion, expected):
    assert gate(psnr, parity, champion) == expected


def test_gate_promotes_neither_a_model_below_the_baseline_nor_a_sweeps():
    assert gate(30.0, True, 20.0, above_baseline=False) == CHALLENGER
    assert gate(30.0, True, None, above_baseline=False) == CHALLENGER  # not even the first version
    assert gate(30.0, True, 20.0, promote=False) == CANDIDATE
    assert gate(10.0, True, 20.0, promote=False) == CHALLENGER


def add(
    onnx_model: Path, name: str, psnr: float, parity: bool = True, frames=None, data_hash="md5-of-tiny-cache", **more
):
    """A new version of `name`, made by a (real, empty) training run of its own; `more`: register's other
    arguments."""
    mlflow.set_experiment("registry-tests")
    with mlflow.start_run(run_name="train") as training:
        pass
    with mlflow.start_run(run_name="register"):  # the stage starts it through tracking.store
        return register(
            onnx_model,
            name=name,
            test_psnr=psnr,
            parity_passed=parity,
            metrics={"parity_max_abs_error": 1e-7},
            limits=ServedLimits.of(shipped("serve")),
            training_manifest=None,
            frames=frames,
            lineage={"training_run_id": training.info.run_id, "data_hash": data_hash, "git_commit": None},
            **more,
        )


class Frames:
    """Test frames a, b, c; each version's PSNR on them and which of them each version trained on (the gate's
    inputs; the real scoring through served models is test_register_stage's)."""

    def __init__(self, psnr: dict[str, float], trained_on: dict[str, frozenset[str] | None]):
        self.psnr, self.seen, self.scored = psnr, trained_on, []

    def score(self, model_uri: str, leave_out: frozenset[str] = frozenset()) -> tuple[float, int]:
        kept = [frame for frame in "abc" if frame not in leave_out]
        self.scored.append((model_uri, "".join(kept)))
        return self.psnr[model_uri.rsplit("/", 1)[1]], len(kept)

    def trained_on(self, model_uri: str) -> frozenset[str] | None:
        return self.seen[model_uri.rsplit("/", 1)[1]]


@pytest.mark.slow  # a real MLflow server
def test_gate_scores_the_champion_on_the_new_test_set(client, onnx_model):
    """A stored PSNR measured on other images decides nothing: both models are scored on the same frames."""
    add(onnx_model, "fair", 30.0)
    frames = Frames({"1": 18.0, "2": 19.0, "3": 17.0}, {})  # version -> PSNR on the new test frames
    better = add(onnx_model, "fair", 25.0, frames=frames)  # lower stored PSNR, better on the same frames
    assert better.alias == CHAMPION and frames.scored == [("models:/fair/2", "abc"), ("models:/fair/1", "abc")]
    assert better.gate == {
        "basis": "same test set, same code",
        "champion_version": 1,
        "new_psnr": 19.0,
        "champion_psnr": 18.0,
        "frames": 3,
        "data_hash_differs": False,
    }
    tags = client.get_model_version("fair", "2").tags
    assert (tags["gate_new_psnr"], tags["gate_champion_psnr"], tags["gate_frames"]) == ("19.0", "18.0", "3")
    worse = add(onnx_model, "fair", 40.0, frames=frames)  # higher stored PSNR, worse on the same frames
    assert worse.alias == CHALLENGER and worse.gate["data_hash_differs"] is False
    assert aliases(client, "fair") == {CHAMPION: 2, CHALLENGER: 3}


@pytest.mark.slow  # a real MLflow server
def test_on_other_data_the_gate_leaves_out_the_frames_the_champion_trained_on(client, onnx_model):
    """New data may hold the champion's own training frames: scored on them it would look better than it is."""
    add(onnx_model, "moved", 20.0, data_hash="md5-of-old-data")
    frames = Frames({"1": 30.0, "2": 19.0, "3": 25.0, "4": 40.0}, {"1": frozenset("a"), "2": frozenset("abc")})
    better = add(onnx_model, "moved", 21.0, frames=frames)
    assert frames.scored == [("models:/moved/2", "bc"), ("models:/moved/1", "bc")]  # frame a left out for both
    assert better.alias == CHALLENGER and better.gate == {
        "basis": "the new test frames the champion never trained on, same code",
        "champion_version": 1,
        "new_psnr": 19.0,
        "champion_psnr": 30.0,
        "frames": 2,
        "data_hash_differs": True,
    }
    promote(client, "moved", 2)
    # Version 2 trained on every new test frame: nothing left to compare on, so it stays champion, and says why.
    unseen = add(onnx_model, "moved", 50.0, frames=frames, data_hash="md5-of-newer-data")
    assert unseen.alias == CHALLENGER and unseen.gate["basis"].startswith(
        "not compared: the champion trained on every new test frame"
    )
    assert client.get_model_version("moved", "3").tags["gate_basis"] == unseen.gate["basis"]
    promote(client, "moved", 3)
    # Version 3 was registered without its training manifest: which frames it saw is unknown.
    unknown = add(onnx_model, "moved", 50.0, frames=Frames({"3": 1.0, "4": 40.0}, {"3": None}), data_hash="other")
    assert unknown.alias == CHALLENGER and "does not record which frames" in unknown.gate["basis"]


@pytest.mark.slow  # a real MLflow server
def test_a_model_below_the_mean_image_baseline_is_never_champion(client, onnx_model):
    """A model that ignores its input does better: it is registered, inspectable, but never served by default."""
    first = add(onnx_model, "below", 14.93, baseline_psnr=17.46)
    assert (first.version, first.alias, first.gate["baseline_psnr"]) == (1, CHALLENGER, 17.46)
    assert "below the mean-image baseline's 17.46 dB" in " ".join(first.held_back)
    assert CHAMPION not in aliases(client, "below")
    assert client.get_model_version("below", "1").tags["gate_baseline_psnr"] == "17.46"
    above = add(onnx_model, "below", 18.0, baseline_psnr=17.46)
    assert above.alias == CHAMPION and above.held_back == ()
    # version 3 beats the champion on the same frames, but not the mean image
    worse_than_mean = add(onnx_model, "below", 17.0, baseline_psnr=17.46, frames=Frames({"2": 18.0, "3": 30.0}, {}))
    assert worse_than_mean.alias == CHALLENGER and aliases(client, "below")[CHAMPION] == 2


@pytest.mark.slow  # a real MLflow server
def test_a_sweep_that_wins_the_gate_is_a_candidate_and_leaves_the_champion(client, onnx_model):
    frames = Frames({"1": 18.0, "2": 25.0, "3": 10.0, "4": 26.0}, {})
    add(onnx_model, "swept", 20.0)
    better = add(onnx_model, "swept", 20.0, frames=frames, promote=False)
    assert better.alias == CANDIDATE and "register.promote is off" in better.held_back[0]
    worse = add(onnx_model, "swept", 20.0, frames=frames, promote=False)
    assert worse.alias == CHALLENGER and worse.held_back == ()
    assert aliases(client, "swept") == {CHAMPION: 1, CANDIDATE: 2, CHALLENGER: 3}
    asked = add(onnx_model, "swept", 20.0, frames=frames)  # the user's own run, or a sweep told to promote
    assert asked.alias == CHAMPION and aliases(client, "swept")[CHAMPION] == 4


def promote(client: MlflowClient, name: str, version: int) -> None:
    client.set_registered_model_alias(name, CHAMPION, str(version))


def aliases(client: MlflowClient, name: str) -> dict[str, int]:
    return {alias: int(version) for alias, version in client.get_registered_model(name).aliases.items()}


@pytest.mark.slow  # a real MLflow server
def test_champion_moves_only_for_a_better_model(client, onnx_model):
    first = add(onnx_model, "gated", 20.0)
    assert (first.version, first.alias, first.champion_psnr_before) == (1, CHAMPION, None)

    worse = add(onnx_model, "gated", 18.0)
    assert (worse.version, worse.alias, worse.champion_psnr_before) == (2, CHALLENGER, 20.0)
    assert aliases(client, "gated") == {CHAMPION: 1, CHALLENGER: 2}

    better = add(onnx_model, "gated", 25.0)
    assert (better.version, better.alias) == (3, CHAMPION)
    assert aliases(client, "gated") == {CHAMPION: 3, CHALLENGER: 2}

    unchecked = add(onnx_model, "gated", 40.0, parity=False)
    assert (unchecked.version, unchecked.alias) == (4, CHALLENGER)
    assert aliases(client, "gated") == {CHAMPION: 3, CHALLENGER: 4}
    # Nothing was overwritten: every version is still there with its own PSNR.
    psnrs = {int(v.version): float(v.tags["test_psnr"]) for v in client.search_model_versions("name='gated'")}
    assert psnrs == {1: 20.0, 2: 18.0, 3: 25.0, 4: 40.0}


@pytest.mark.slow  # a real MLflow server
def test_version_carries_lineage_signature_and_metrics(client, onnx_model):
    added = add(onnx_model, "lineage", 21.5)
    version = client.get_model_version("lineage", str(added.version))
    assert version.run_id == version.tags["training_run_id"]  # the version links to the run that trained it
    assert client.get_run(version.run_id).info.run_name == "train"
    assert version.tags["data_hash"] == "md5-of-tiny-cache"
    assert version.tags["parity_passed"] == "true"
    assert "git_commit" not in version.tags  # None values are skipped, not written as "None"
    experiment = client.get_experiment_by_name("registry-tests").experiment_id
    [packed_by] = client.search_runs(
        [experiment], "attributes.run_name = 'register'", order_by=["attributes.start_time DESC"], max_results=1
    )
    assert packed_by.data.metrics == {"test_psnr": 21.5, "parity_max_abs_error": 1e-7}
    info = mlflow.models.get_model_info(f"models:/lineage/{added.version}")
    assert info.signature.inputs.input_names() == [IMAGE]
    assert info.saved_input_example_info is not None
    assert "the input's width x height, in register" in info.metadata["output"]  # what the strings hold, for a reader


def run_register_stage(
    project: Path,
    tracking_uri: str,
    models: Path,
    psnr: float,
    name: str = "staged",
    baseline: float | None = None,
    env: dict[str, str] | None = None,
    settings: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """The register stage on `models` scored `psnr` (and the mean-image baseline `baseline`) by evaluate; `env`: what
    DVC exports to a stage; `settings`: more --set overrides."""
    write_stage_record(project, models, psnr, parity_error=2e-7)
    if baseline is not None:
        scores = json.loads((project / EVAL_METRICS).read_text())
        (project / EVAL_METRICS).write_text(json.dumps(scores | {"baseline_mean_image": {"psnr": baseline}}))
    result = subprocess.run(
        [sys.executable, str(REGISTER), "--params", str(SHIPPED_FROM), "--set", f"register.model_name={name}"]
        + [argument for setting in settings for argument in ("--set", setting)],
        cwd=project,
        capture_output=True,
        text=True,
        env=os.environ | {"MLFLOW_TRACKING_URI": tracking_uri, "MLFLOW_DISABLE_TELEMETRY": "true"} | (env or {}),
    )
    assert result.returncode == 0, result.stderr
    return result


def registered(project: Path) -> dict:
    return json.loads((project / "reports" / "registered.json").read_text())


@pytest.mark.slow  # a real MLflow server
def test_register_stage(tracking_uri, onnx_model, tiny_cache, tmp_path, write_params):
    shutil.copytree(tiny_cache, tmp_path / "data" / "cache")
    run_register_stage(tmp_path, tracking_uri, onnx_model.parent, 22.0)
    assert registered(tmp_path) == {
        "model_name": "staged",
        "version": 1,
        "alias": CHAMPION,
        "test_psnr": 22.0,
        "gate": {"basis": "no champion yet"},
    }
    client = MlflowClient(tracking_uri)
    version = client.get_model_version("staged", "1")
    training = client.get_run(version.run_id)  # logged from the record: this store never saw the training
    assert training.info.run_name == "train" and training.data.tags["logged_from"] == "dvc record"
    assert version.tags["training_run_id"] == version.run_id
    assert training.data.tags["generator_sha256"] == version.tags["generator_sha256"]
    evaluation = client.get_run(version.tags["evaluation_run_id"])
    assert evaluation.data.metrics["test_psnr"] == 22.0 and evaluation.data.tags["train_run_id"] == version.run_id

    # The same files again: the store holds them already, so nothing is added.
    again = run_register_stage(tmp_path, tracking_uri, onnx_model.parent, 22.0)
    assert "version 1 already (@champion); nothing added" in again.stdout
    assert registered(tmp_path)["version"] == 1 and len(client.search_model_versions("name = 'staged'")) == 1
    experiment = [client.get_experiment_by_name("thermal2visible").experiment_id]
    trainings = f"attributes.run_name = 'train' and tags.generator_sha256 = '{version.tags['generator_sha256']}'"
    assert len(client.search_runs(experiment, trainings)) == 1

    # Another model of the same data: both are scored on the same frames by the same code.
    other = export_tiny(tmp_path / "other_model", tiny_cache, seed=1).parent
    second = run_register_stage(tmp_path, tracking_uri, other, 21.0)
    gate = registered(tmp_path)["gate"]
    assert registered(tmp_path)["version"] == 2
    assert gate["basis"] == "same test set, same code" and gate["champion_version"] == 1
    assert gate["new_psnr"] > 5 and gate["champion_psnr"] > 5 and gate["data_hash_differs"] is False
    assert registered(tmp_path)["alias"] == (CHAMPION if gate["new_psnr"] >= gate["champion_psnr"] else CHALLENGER)
    assert "full-frame test PSNR" in second.stdout
    champion = client.get_registered_model("staged").aliases[CHAMPION]

    # A model trained on a new split of the same pictures: some of its test frames are the champion's training ones.
    resplit = resplit_cache(tiny_cache, tmp_path / "resplit", write_params)
    shutil.rmtree(tmp_path / "data" / "cache")
    shutil.copytree(resplit, tmp_path / "data" / "cache")
    third = run_register_stage(tmp_path, tracking_uri, export_tiny(tmp_path / "resplit_model", resplit).parent, 21.0)
    old, new = (json.loads((cache / MANIFEST).read_text())["sources"] for cache in (tiny_cache, resplit))
    seen = {digest for source in old if source["split"] != "test" for digest in source["sha256"].values()}
    unseen = [source for source in new if source["split"] == "test" and not set(source["sha256"].values()) & seen]
    assert 0 < len(unseen) < sum(source["split"] == "test" for source in new)  # the case this test is about
    gate = registered(tmp_path)["gate"]
    assert gate["data_hash_differs"] is True and gate["frames"] == len(unseen)
    assert gate["basis"] == "the new test frames the champion never trained on, same code"
    assert f"on {len(unseen)} frames" in third.stdout
    tags = client.get_model_version("staged", "3").tags
    assert tags["gate_data_hash_differs"] == "true" and tags["gate_champion_version"] == str(champion)


@pytest.mark.slow  # a real MLflow server
def test_the_register_stage_keeps_the_users_champion_and_describes_each_version(
    tracking_uri, onnx_model, tiny_cache, tmp_path
):
    """A first short run below the mean-image baseline is registered but not served, a quick sweep from DVC's queue
    after the user's own run leaves the user's @champion, and the model and each version say in the MLflow UI what
    they are."""
    shutil.copytree(tiny_cache, tmp_path / "data" / "cache")
    client = MlflowClient(tracking_uri)
    short = run_register_stage(tmp_path, tracking_uri, onnx_model.parent, 14.93, "intent", baseline=17.46)
    assert registered(tmp_path)["alias"] == CHALLENGER
    assert (
        "register: version 1 is not @champion: its test PSNR 14.93 dB is below the mean-image baseline's 17.46 dB"
        in short.stdout
    )
    with pytest.raises(PipelineError, match=r"no version of intent is @champion \(its versions: 1 @challenger;"):
        served_from(client, "models:/intent@champion")  # make serve says what there is, instead of MLflow's 404

    model = client.get_registered_model("intent")
    assert "built-in portrait scene" in model.description and "@champion" in model.description
    first = client.get_model_version("intent", "1")
    for shown in (
        "- **Data**: the built-in portrait scene",
        f"trained by run `{first.run_id}`",
        f"evaluated by run `{first.tags['evaluation_run_id']}`",
        "git commit unknown",  # the project here is no git repository
        "test PSNR 14.93 dB",
        "mean-image baseline 17.46 dB",
        "**Registered as** `@challenger`: no champion yet; not promoted: its test PSNR 14.93 dB is below",
    ):
        assert shown in first.description, first.description
    assert first.tags["data"].startswith("the built-in portrait scene") and "unet generator" in first.tags["settings"]

    # The user's own run, above the baseline: it takes @champion, and make serve names it and where it came from.
    other = export_tiny(tmp_path / "users_model", tiny_cache, seed=1).parent
    run_register_stage(tmp_path, tracking_uri, other, 21.0, "intent", baseline=17.46)
    assert registered(tmp_path)["alias"] == CHAMPION
    served, data, settings = served_from(client, "models:/intent@champion")
    champion = client.get_model_version("intent", "2")
    assert served == f"intent version 2 @champion, test PSNR 21.00 dB: trained by run {champion.run_id}"
    assert data.startswith("data: the built-in portrait scene") and settings.startswith("settings: unet generator")

    # A quick sweep's experiment, run from DVC's queue in DVC's copy of the project: it never takes @champion.
    swept = export_tiny(tmp_path / "swept_model", tiny_cache, seed=2).parent
    queued = {"DVC_ROOT": str(tmp_path / "elsewhere"), "DVC_EXP_NAME": "quick-32"}
    run_register_stage(tmp_path, tracking_uri, swept, 23.0, "intent", baseline=17.46, env=queued)
    gate = registered(tmp_path)["gate"]
    assert registered(tmp_path)["alias"] == (CANDIDATE if gate["new_psnr"] >= gate["champion_psnr"] else CHALLENGER)
    assert client.get_registered_model("intent").aliases[CHAMPION] == "2"
    third = client.get_model_version("intent", "3")
    assert third.tags["dvc_experiment"] == "quick-32" and "DVC experiment `quick-32`" in third.description

    # Asked to: the same kind of experiment with register.promote=true competes for @champion as the user's own.
    asked = export_tiny(tmp_path / "asked_model", tiny_cache, seed=3).parent
    run_register_stage(tmp_path, tracking_uri, asked, 23.0, "intent", env=queued, settings=("register.promote=true",))
    gate = registered(tmp_path)["gate"]
    assert registered(tmp_path)["alias"] == (CHAMPION if gate["new_psnr"] >= gate["champion_psnr"] else CHALLENGER)


def resplit_cache(tiny_cache: Path, folder: Path, write_params) -> Path:
    """The tiny pictures through ingest and preprocess again, split with another seed."""
    folder.mkdir()
    params = load_params(write_params(folder, "preprocess.seed=7"))
    index, _ = ingest(tiny_cache.parent / "raw", "pairs", params.ingest)
    build_cache(index, params.preprocess, params.ingest.max_pixels, folder / "cache", on_error="fail")
    return folder / "cache"


@pytest.mark.slow  # a real MLflow server
def test_register_stage_needs_evaluation(tracking_uri, onnx_model, tmp_path):
    (tmp_path / "models").mkdir()
    shutil.copy(onnx_model, tmp_path / "models" / "generator.onnx")
    result = subprocess.run(
        [sys.executable, str(REGISTER), "--params", str(SHIPPED_FROM)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=os.environ | {"MLFLOW_TRACKING_URI": tracking_uri},
    )
    assert result.returncode == 1
    assert result.stderr.strip() == "error: metrics/export.json: missing (dvc repro runs the stage that writes it)"


# thermal kind -> (one frame of it, its file format, the normalisation a user of such frames trains with)
THERMAL_KINDS = {
    "uint8": (lambda seed: rgb(seed=seed)[:, :, 0], png, "percentile"),
    "uint16": (lambda seed: thermal16(seed=seed), png, "percentile"),
    "uint8 RGB": (lambda seed: rgb(seed=seed), png, "percentile"),
    "float32": (lambda seed: temperatures(seed=seed), tiff, "temperature"),
}


def cache_of_kind(folder: Path, kind: str, write_params) -> Path:
    """A 6-pair dataset whose thermal frames are all of `kind`, through the real ingest and preprocess."""
    frame, encode, norm = THERMAL_KINDS[kind]
    suffix = ".tif" if encode is tiff else ".png"
    for seed in range(6):
        for side, image, save in (("thermal", frame(seed), encode), ("visible", rgb(seed=seed), png)):
            path = folder / "raw" / side / f"person_{seed % 3}" / f"{seed}{suffix if side == 'thermal' else '.png'}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(save(image))
    # random pictures share no outline for the camera registration to lay onto each other: align off
    params = load_params(write_params(folder, f"preprocess.thermal_norm={norm}", "preprocess.align=false"))
    index, _ = ingest(folder / "raw", "pairs", params.ingest)
    build_cache(index, params.preprocess, params.ingest.max_pixels, folder / "cache", on_error="fail")
    return folder / "cache"


@pytest.mark.slow  # a real MLflow server
@pytest.mark.parametrize("kind", THERMAL_KINDS)
def test_a_registered_model_carries_an_example_of_the_frames_it_was_trained_on(client, tmp_path, kind, write_params):
    """A temperature-map model's example is a float map, a 16-bit model's 16-bit, an RGB model's RGB, and each
    predicts (registration checks it). Before, every grey model got a 16-bit example, which a temperature model
    refuses: MLflow logged a warning and registered it anyway."""
    frame, _, _ = THERMAL_KINDS[kind]
    model = export_tiny(tmp_path / "model", cache_of_kind(tmp_path, kind, write_params))
    added = add(model, f"kind-{kind.replace(' ', '-')}", 20.0)
    uri = f"models:/{added.name}/{added.version}"
    example = mlflow.pyfunc.load_model(uri).input_example
    sent = decode_image(base64.b64decode(example[IMAGE][0]), "example", 10_000)
    assert (sent.dtype, sent.shape[2:]) == (frame(0).dtype, frame(0).shape[2:])
    assert (
        f"trained on {kind.split()[0]} {'RGB' if 'RGB' in kind else 'grey'}"
        in mlflow.models.get_model_info(uri).metadata["input"]
    )


@pytest.mark.slow  # a real MLflow server
def test_a_model_that_fails_on_its_own_example_is_not_registered(client, onnx_model, tmp_path):
    """An .onnx whose settings agree with each other but not with its graph (half the graph's size) cannot
    translate anything: registration stops, naming the file, and no version appears."""
    broken = onnx.load(onnx_model)
    props = {prop.key: json.loads(prop.value) for prop in broken.metadata_props}
    props["image_size"] = props["preprocess"]["image_size"] = props["image_size"] // 2  # not the graph's
    onnx.helper.set_model_props(broken, {key: json.dumps(value) for key, value in props.items()})
    onnx.save_model(broken, tmp_path / "broken.onnx")
    with pytest.raises(PipelineError, match=r"broken.onnx: metadata image_size \d+: the graph cannot run"):
        add(tmp_path / "broken.onnx", "broken", 20.0)
    assert client.search_model_versions("name='broken'") == []


# A registry writer's code file: what it does when run, it announces in the file that T2V_MARKER names.
TAMPERED_CODE = """import os, pathlib
import mlflow.models
from thermal2visible.inference.serving import ThermalToVisible
if os.environ.get("T2V_MARKER"):
    pathlib.Path(os.environ["T2V_MARKER"]).write_text("the registry's code ran")
mlflow.models.set_model(ThermalToVisible())
"""


@pytest.mark.slow  # a real MLflow server
def test_a_tampered_version_runs_no_code_in_translate_or_the_gate(client, tracking_uri, tiny_cache, tmp_path):
    """A version whose model code was replaced, made champion: translate and the register stage's gate run its ONNX
    file with the installed code; loading it as a pyfunc (what `mlflow models serve` does) runs the replacement."""
    onnx_file = export_tiny(tmp_path / "model", tiny_cache)
    (tmp_path / "tampered.py").write_text(TAMPERED_CODE)
    mlflow.set_experiment(SHIPPED.mlflow.experiment)  # where a tracking server's versions are trusted
    with mlflow.start_run():
        with pyfunc_arguments(onnx_file, ServedLimits.of(shipped("serve")), tiny_cache / MANIFEST) as arguments:
            arguments["python_model"] = str(tmp_path / "tampered.py")
            logged = mlflow.pyfunc.log_model(name="model", **arguments)
    client.create_registered_model("tampered")
    version = client.create_model_version("tampered", logged.model_uri, model_id=logged.model_id)
    client.set_registered_model_alias("tampered", CHAMPION, version.version)
    marker = tmp_path / "ran"
    env = os.environ | {
        "MLFLOW_TRACKING_URI": tracking_uri,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "T2V_MARKER": str(marker),
    }

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "frame.png").write_bytes(decode_png_of(tiny_cache))
    translate = [sys.executable, str(ROOT / "pipelines" / "translate.py"), "--model", "models:/tampered@champion"]
    done = subprocess.run(
        [*translate, "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "frame.png").is_file() and not marker.exists()

    project = tmp_path / "project"
    shutil.copytree(tiny_cache, project / "data" / "cache")
    write_stage_record(project, export_tiny(tmp_path / "other", tiny_cache, seed=1).parent, 21.0)
    done = subprocess.run(
        [sys.executable, str(REGISTER), "--params", str(SHIPPED_FROM), "--set", "register.model_name=tampered"],
        cwd=project,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads((project / "reports" / "registered.json").read_text())["gate"]["champion_version"] == 1
    assert not marker.exists()

    load = "import mlflow.pyfunc; mlflow.pyfunc.load_model('models:/tampered/1')"  # the champion may have moved
    loaded = subprocess.run([sys.executable, "-c", load], env=env, capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert marker.is_file(), loaded.stdout + loaded.stderr
    assert marker.read_text() == "the registry's code ran"  # the threat is real where a pyfunc is loaded


def decode_png_of(cache: Path) -> bytes:
    """One of the tiny set's raw thermal frames, as the file it was written."""
    return next((cache.parent / "raw" / "thermal").rglob("*.png")).read_bytes()


def test_a_version_whose_identity_could_not_be_scored_is_described_with_the_reason(tiny_params):
    from thermal2visible.registry.descriptions import version_facts

    # what evaluate writes when the test split holds one person: verification has no different-person pair
    why = "the test split holds one person, so there are no different-person pairs and no score"
    identity = {"score": "verification_auc", "why": why, "faces": 3, "generator": None, "real_visible": None}
    evaluated = {"generator": {"psnr": 20.0}, "identity": identity}
    sources = [{"split": split} for split in ("train", "train", "val", "test")]
    facts = version_facts(tiny_params, sources, {"epochs_run": 2, "best_epoch": 2}, evaluated)
    assert f"identity verification_auc: none ({why})" in facts["scores"]
