"""ONNX export: one self-contained file, dynamic batch, metadata, parity with PyTorch on real cached images."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from tests.support.tiny_model import save_tiny_generator

from tests.support.shipped import SHIPPED_FROM
from thermal2visible.errors import PipelineError
from thermal2visible.config.load import load_params
from thermal2visible.onnx_export import cache_to_model_input, check_parity, export_generator, run_torch
from thermal2visible.inference.session import onnx_metadata, onnx_session, run_onnx
from thermal2visible.models.payloads import load_generator
from thermal2visible.paths import EXPORT_METRICS, EXPORT_REPORT
from thermal2visible.stage_records import read_record
from thermal2visible.tracking.digests import data_hash

ROOT = Path(__file__).resolve().parents[2]
EXPORT = ROOT / "pipelines" / "export.py"


@pytest.fixture(scope="module")
def project(tmp_path_factory, tiny_cache) -> Path:
    """A project folder after `preprocess` and `train`: data/cache and models/generator.pt."""
    root = tmp_path_factory.mktemp("export")
    shutil.copytree(tiny_cache, root / "data" / "cache")
    save_tiny_generator(root / "models" / "generator.pt", tiny_cache)
    return root


@pytest.fixture(scope="module")
def exported(project) -> dict:
    """Run the export stage (with int8) in `project`; its metrics/export.json."""
    main = runpy.run_path(str(EXPORT))["main"]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        main(load_params(SHIPPED_FROM, ["export.int8=true"]))
    return read_record(project / EXPORT_METRICS, project / EXPORT_REPORT)


@pytest.fixture(scope="module")
def test_images(tiny_cache) -> np.ndarray:
    return cache_to_model_input(np.load(tiny_cache / "test_thermal.npy"))


def test_one_self_contained_file_that_checks(project, exported):
    path = project / "models" / "generator.onnx"
    assert sorted(p.name for p in path.parent.iterdir()) == ["generator.int8.onnx", "generator.onnx", "generator.pt"]
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    assert not any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer)
    assert model.opset_import[0].version == 18


def test_metadata_carries_what_serving_needs(project, exported):
    _, payload = load_generator(project / "models" / "generator.pt")
    metadata = onnx_metadata(onnx_session(project / "models" / "generator.onnx"))
    assert metadata["opset"] == 18
    assert metadata["image_size"] == payload["model"]["image_size"]
    assert metadata["in_channels"] == payload["model"]["in_channels"]
    assert metadata["preprocess"] == payload["preprocess"]
    assert (metadata["fingerprint"], metadata["data_hash"]) == ("fingerprint-0", data_hash(project / "data" / "cache"))


def test_dynamic_batch_matches_torch_on_real_images(project, exported, test_images):
    generator, _ = load_generator(project / "models" / "generator.pt")
    session = onnx_session(project / "models" / "generator.onnx")
    for batch in (test_images[:1], test_images[:3], test_images):
        onnx_out = run_onnx(session, batch)
        assert onnx_out.shape[0] == len(batch)
        assert np.abs(onnx_out - run_torch(generator, batch)).max() <= 1e-3


def test_export_metrics(project, exported, test_images):
    assert exported["parity_passed"] is True
    assert exported["parity_images"] == len(test_images)
    assert 0 <= exported["parity_max_abs_error"] <= exported["atol"]
    assert exported["size_bytes"] == (project / "models" / "generator.onnx").stat().st_size
    assert not any("latency" in key for key in exported)  # seconds differ every run: printed, never tracked
    # Static QDQ int8 stores weights in a quarter of the bytes and stays close to the fp32 output.
    assert exported["int8_size_bytes"] < exported["size_bytes"] / 2
    assert exported["int8_psnr_vs_fp32"] > 20


def test_export_is_in_eval_mode(project, exported, test_images):
    """Dropout on or batch statistics would make two runs, or a batch and its halves, disagree."""
    session = onnx_session(project / "models" / "generator.onnx")
    whole = run_onnx(session, test_images)
    halves = np.concatenate([run_onnx(session, test_images[:1]), run_onnx(session, test_images[1:])])
    np.testing.assert_allclose(whole, halves, atol=1e-5)


def test_a_generator_tested_in_train_mode_is_not_exported(tiny_cache, tmp_path):
    """Dropout on at test time makes every output random: nothing to check against PyTorch, nothing to serve."""
    generator, payload = load_generator(save_tiny_generator(tmp_path / "generator.pt", tiny_cache))
    with pytest.raises(PipelineError, match="train.test_mode: 'train'.*dropout on"):
        export_generator(
            generator, payload | {"test_mode": "train"}, tmp_path / "generator.onnx", opset=18, thermal_dtype="uint16"
        )
    assert not (tmp_path / "generator.onnx").exists()


def test_mismatched_model_fails_parity_loudly(project, exported, test_images, tiny_cache, tmp_path):
    other, _ = load_generator(save_tiny_generator(tmp_path / "other.pt", tiny_cache, seed=1))
    session = onnx_session(project / "models" / "generator.onnx")
    with pytest.raises(PipelineError, match=r"parity check failed: max \|onnxruntime - torch\| = \S+ .* export.atol"):
        check_parity(session, other, test_images, atol=1e-3)


def test_nan_output_fails_parity(project, exported, test_images):
    broken, _ = load_generator(project / "models" / "generator.pt")
    with torch.no_grad():
        next(broken.parameters()).fill_(float("nan"))
    with pytest.raises(PipelineError, match="nan"):
        check_parity(onnx_session(project / "models" / "generator.onnx"), broken, test_images, atol=1e-3)


@pytest.mark.slow  # a stage subprocess
def test_stage_without_generator_says_so(tmp_path):
    result = subprocess.run(
        [sys.executable, str(EXPORT), "--params", str(SHIPPED_FROM)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=os.environ | {"MLFLOW_DISABLE_TELEMETRY": "true"},
    )
    assert result.returncode == 1
    assert result.stderr.strip() == "error: models/generator.pt: no trained generator here (run the train stage first)"


def test_height_and_width_are_dynamic_multiples_of_the_training_size(project, exported):
    """Whole frames run fully convolutionally: any multiple of the training size, not just the training square."""
    session = onnx_session(project / "models" / "generator.onnx")
    generator, _ = load_generator(project / "models" / "generator.pt")
    size = generator.config["image_size"]
    assert session.get_inputs()[0].shape[2:] == [f"{size}*rows", f"{size}*cols"]
    for rows, cols in ((1, 1), (2, 5), (4, 3)):
        frame = np.random.default_rng(rows).uniform(-1, 1, (1, 1, rows * size, cols * size)).astype(np.float32)
        generated = run_onnx(session, frame)
        assert generated.shape == (1, 3, rows * size, cols * size)
        np.testing.assert_allclose(generated, run_torch(generator, frame), atol=1e-4)


@pytest.mark.slow  # processes
def test_the_same_weights_export_to_the_same_bytes_in_every_process(project, tmp_path):
    """dvc.lock hashes the .onnx: a rerun that trains the same weights must write the same file, whatever the
    process's string-hash seed (torch.export prints some of its notes in hash order)."""
    script = (
        "import sys; from pathlib import Path; from tests.support.tiny_model import export_tiny_generator; "
        "export_tiny_generator(Path(sys.argv[1]), Path(sys.argv[2]))"
    )
    digests = set()
    for seed in ("1", "2", "3"):
        folder = tmp_path / seed
        folder.mkdir()
        env = os.environ | {
            "PYTHONHASHSEED": seed,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        subprocess.run(
            [sys.executable, "-c", script, str(folder), str(project / "data" / "cache")],
            check=True,
            env=env,
            capture_output=True,
        )
        digests.add((folder / "generator.onnx").read_bytes())
    assert len(digests) == 1
    exported = digests.pop()  # nor any path of this checkout (another clone would write other bytes)
    assert b"stack_trace" not in exported and str(ROOT).encode() not in exported
