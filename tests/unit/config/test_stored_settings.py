"""Every setting an ONNX file carries is checked by type and range when a model is loaded: a tampered or broken file
is refused naming the file, the key and the value, instead of serving one image for every input or failing with an
internal error on the first request."""

from __future__ import annotations

import json
import re

import onnx
import pytest
import torch
from tests.support.tiny_model import export_tiny

from thermal2visible.errors import PipelineError
from thermal2visible.registry.version_files import model_of_files
from thermal2visible.models.payloads import load_generator
from thermal2visible.paths import MANIFEST

LIMITS = {"max_pixels": 10**6, "max_model_pixels": 10**6, "max_run_seconds": 60.0, "max_check_seconds": 10.0}


@pytest.fixture(scope="module")
def exported(tiny_cache, tmp_path_factory):
    return export_tiny(tmp_path_factory.mktemp("exported"), tiny_cache)


def tampered(source, target, change) -> str:
    model = onnx.load(str(source))
    metadata = {prop.key: json.loads(prop.value) for prop in model.metadata_props}
    change(metadata)
    del model.metadata_props[:]
    onnx.helper.set_model_props(model, {key: json.dumps(value) for key, value in metadata.items()})
    onnx.save(model, str(target))
    return str(target)


def set_preprocess(key, value):
    return lambda metadata: metadata["preprocess"].__setitem__(key, value)


def set_image_size(size):
    """image_size where both the metadata and its preprocess section hold it, so only the graph can refuse it."""
    return lambda metadata: (
        metadata.__setitem__("image_size", size),
        metadata["preprocess"].__setitem__("image_size", size),
    )


@pytest.mark.parametrize(
    "change, named",
    [
        (set_preprocess("percentiles", [99, 1]), "metadata preprocess.percentiles: [99.0, 1.0] must be increasing"),
        (set_preprocess("percentiles", [-50, 500]), "preprocess.percentiles: [-50.0, 500.0] must be increasing"),
        (set_preprocess("fixed_range", [5, 5]), "preprocess.fixed_range: [5.0, 5.0] must be finite and increasing"),
        (set_preprocess("fixed_range", [1e30, -1e30]), "preprocess.fixed_range: [1e+30, -1e+30] must be finite"),
        (set_preprocess("fixed_range", [-1e308, 1e308]), "preprocess.fixed_range: [-1e+308, 1e+308] must be finite"),
        (set_preprocess("percentiles", [0, 1e-300]), "preprocess.percentiles: [0.0, 1e-300] must be increasing"),
        (set_preprocess("temperature_range", [30, 30.01]), "preprocess.temperature_range: [30.0, 30.01] must be"),
        (set_image_size(17), "metadata image_size 17: the graph cannot run on one 17x17 square"),
        (set_image_size(4096), "metadata image_size 4096: one 4096x4096 square is over max_model_pixels 1000000"),
        (set_preprocess("image_size", -64), "metadata preprocess.image_size: -64 must be >= 16"),
        (lambda metadata: metadata.__setitem__("image_size", 1), "metadata image_size: 1 must be >= "),
        (
            lambda metadata: metadata["preprocess"].pop("thermal_norm"),
            "metadata preprocess.thermal_norm: missing (the export stage writes every key",
        ),
        (
            lambda metadata: metadata.pop("preprocess"),
            "metadata preprocess: missing (the export stage writes every key",
        ),
        (lambda metadata: metadata.__setitem__("in_channels", 3), "metadata in_channels 3 but the graph's thermal"),
        (lambda metadata: metadata.__setitem__("in_channels", "1"), "metadata in_channels: '1' is not one of [1, 3]"),
    ],
)
def test_a_tampered_setting_is_refused_naming_the_file_key_and_value(exported, tmp_path, change, named):
    path = tampered(exported, tmp_path / "tampered.onnx", change)
    with pytest.raises(PipelineError, match=re.escape(f"{path}: ") + ".*" + re.escape(named)):
        model_of_files({"onnx": path}, **LIMITS)


def test_the_exported_settings_load_unchanged(exported, tmp_path):
    """The check refuses what is wrong, not what export writes: a file rewritten with its own metadata loads."""
    path = tampered(exported, tmp_path / "same.onnx", lambda metadata: None)
    assert (
        model_of_files({"onnx": path}, **LIMITS).preprocess
        == model_of_files({"onnx": str(exported)}, **LIMITS).preprocess
    )


@pytest.mark.parametrize("key, value", [("face_crop", True), ("crop_margin", 0.5), ("thermal_norm", "fixed")])
def test_a_setting_that_differs_from_the_training_record_is_refused(exported, tiny_cache, tmp_path, key, value):
    """A setting that changes what the model is fed, valid on its own, but not the one the model trained with (the
    cache manifest packed with a registered version): refused naming the file, the key, both values and the record."""
    path = tampered(exported, tmp_path / "tampered.onnx", set_preprocess(key, value))
    record = str(tiny_cache / MANIFEST)
    assert getattr(model_of_files({"onnx": path}, **LIMITS).preprocess, key) == value  # alone it would load
    with pytest.raises(PipelineError) as refused:
        model_of_files({"onnx": path, "training_manifest": record}, **LIMITS)
    trained = json.loads((tiny_cache / MANIFEST).read_text())["preprocess"][key]
    assert str(refused.value) == (
        f"{path}: metadata preprocess.{key} {value!r} but the training record {record} holds {trained!r}"
    )
    assert model_of_files({"onnx": str(exported), "training_manifest": record}, **LIMITS).preprocess.face_crop is False


def test_a_generator_payload_with_an_unknown_test_mode_is_refused_naming_the_file(exported, tmp_path):
    """Its preprocess section is checked where it is read (`stored_section`, as above); its test mode on load."""
    payload = torch.load(exported.with_name("generator.pt"), weights_only=True)
    payload["test_mode"] = "bogus"
    torch.save(payload, tmp_path / "generator.pt")
    with pytest.raises(PipelineError, match=re.escape(f"{tmp_path / 'generator.pt'}: stored test_mode 'bogus'")):
        load_generator(tmp_path / "generator.pt")


def test_a_payload_written_before_its_later_keys_loads_as_the_generator_it_was(exported, tmp_path):
    """A payload without model.generator and test_mode (what the first versions wrote) is the U-Net, tested in
    eval mode: it rebuilds the same network and translates as the current file does."""
    payload = torch.load(exported.with_name("generator.pt"), weights_only=True)
    assert payload["model"]["generator"] == "unet"
    old = {key: value for key, value in payload.items() if key != "test_mode"}
    old["model"] = {key: value for key, value in payload["model"].items() if key != "generator"}
    torch.save(old, tmp_path / "generator.pt")
    current, _ = load_generator(exported.with_name("generator.pt"))
    upgraded, stored = load_generator(tmp_path / "generator.pt")
    assert stored["test_mode"] == "eval" and stored["model"] == payload["model"]
    size = payload["model"]["image_size"]
    thermal = torch.rand(1, payload["model"]["in_channels"], size, size) * 2 - 1
    with torch.no_grad():
        torch.testing.assert_close(upgraded(thermal), current(thermal), rtol=0, atol=0)
