"""train -> evaluate as DVC runs them (subprocesses in a project dir) on the tiny cache, with a real MLflow store."""

import csv
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import run_script
from tests.support.tiny_model import save_tiny_generator

from thermal2visible.config.load import load_params
from thermal2visible.data.cache import build_cache
from thermal2visible.data.ingest import ingest
from thermal2visible.models.payloads import load_generator
from thermal2visible.paths import EVAL_METRICS, EVAL_REPORT
from thermal2visible.stage_records import read_record
from thermal2visible.tracking.digests import file_digest
from thermal2visible.training.precision import resolve_channels_last
from tests.support.figures import assert_drawn

pytestmark = pytest.mark.slow
SPLITS = ("train", "val", "test")
# Reliable on the tiny set in seconds: L1 dominates (the GAN term only sharpens), small batches give many steps.
TINY_TRAINING = (
    "train.max_epochs=80",
    "train.batch_size=2",
    "train.lr_g=0.001",
    "train.lambda_l1=1000",
    "early_stop.window=5",
    "early_stop.patience=20",
    "model.generator_settings.dropout=0.0",
    "train.image_log_every=40",
)


def run(script: str, project: Path, *args: str) -> subprocess.CompletedProcess:
    return run_script(script, project, *args, timeout=280)


@pytest.fixture
def project(tmp_path, tiny_cache):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cache").symlink_to(tiny_cache)
    return tmp_path


@pytest.mark.timeout(400)
def test_train_then_evaluate_beats_the_mean_face(project, write_params):
    from mlflow import MlflowClient

    write_params(project, *TINY_TRAINING)
    trained = run("train.py", project)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    summary = json.loads((project / "metrics" / "train.json").read_text())
    generator, payload = load_generator(project / "models" / "generator.pt")
    assert payload["epoch"] == summary["best_epoch"] >= 5 and payload["psnr_smoothed"] == summary["best_psnr_smoothed"]
    assert payload["data_hash"] and payload["preprocess"]["image_size"] == 32
    with (project / "metrics" / "psnr.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == summary["epochs_run"] and rows[3]["psnr_smoothed"] == "" and rows[4]["psnr_smoothed"]
    assert_drawn(project / "reports" / "psnr_curve.png")
    epochs = [line for line in trained.stdout.splitlines() if line.startswith("epoch ")]  # progress, one per epoch
    assert [line.split(":")[0] for line in epochs] == [f"epoch {n}/80" for n in range(1, summary["epochs_run"] + 1)]
    best = f"best {summary['best_psnr_smoothed']:.2f} dB at epoch {summary['best_epoch']}"
    assert best in epochs[-1]

    assert run("train_recognizer.py", project).returncode == 0
    evaluated = run("evaluate.py", project)
    assert evaluated.returncode == 0, evaluated.stdout + evaluated.stderr
    scores = read_record(project / EVAL_METRICS, project / EVAL_REPORT)
    assert scores["generator"]["psnr"] > scores["baseline_mean_image"]["psnr"] > scores["baseline_thermal"]["psnr"]
    identity = scores["identity"]  # the tiny set splits at random: test people were seen in training
    assert identity["score"] == "rank1_accuracy" and identity["faces"] == scores["test_images"]
    assert all(0 <= identity[name] <= 1 for name in ("generator", "real_visible", "thermal_input"))
    assert (project / "reports" / "eval_grid.png").is_file()

    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    runs = {
        run.info.run_name: run
        for run in client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
    }
    train_run = runs["train"]
    # tracked files hold the run's fingerprint, never its run id: the run is found by that tag; metrics are numbers
    assert payload["fingerprint"] == train_run.data.tags["fingerprint"]
    assert all(type(value) in (int, float) for value in summary.values()), summary
    # the register stage finds the run by the weights it wrote, and logs the evaluation from eval.json (test_registry)
    assert train_run.data.tags["generator_sha256"] == file_digest(project / "models" / "generator.pt")
    assert "evaluate" not in runs and scores["generator_sha256"] == train_run.data.tags["generator_sha256"]
    assert float(train_run.data.tags["train_seconds"]) > 0 and "seconds" not in summary
    assert train_run.data.params["train.lambda_l1"] == "1000.0" and train_run.data.tags["data_hash"]
    # the param says `auto`; the tag says what it picked on this machine
    picked = resolve_channels_last("auto", "cpu", train_run.data.tags["precision"])
    assert train_run.data.tags["memory_format"] == ("channels_last" if picked else "nchw")
    for key in ("loss_g", "images_per_s"):  # one point per epoch, stepped by epoch
        assert [m.step for m in client.get_metric_history(train_run.info.run_id, key)] == list(
            range(1, summary["epochs_run"] + 1)
        ), key
    assert {a.path for a in client.list_artifacts(train_run.info.run_id)} >= {"generator.pt", "psnr_curve.png"}


def test_identity_loss_without_identities_or_recognizer_fails_clearly(project, write_params):
    write_params(project, "train.lambda_id=1.0", "early_stop.window=1")
    result = run("train.py", project)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "models/recognizer.pt: no recognizer" in result.stderr  # the tiny set has identities, no recognizer yet


def test_diverging_settings_stop_with_a_clear_error(project, write_params):
    write_params(
        project,
        "train.lr_g=1.0e+30",
        "train.lr_d=1.0e+30",
        "train.max_bad_steps=0",
        "train.precision=32-true",
        "early_stop.window=1",
    )
    result = run("train.py", project)
    assert result.returncode == 1 and "training diverged" in result.stderr and "Traceback" not in result.stderr
    assert not (project / "models" / "generator.pt").exists()


def test_recognizer_feeds_the_identity_loss(project, write_params):
    from mlflow import MlflowClient

    write_params(project, "recognizer.epochs=3", "train.lambda_id=0.5", "train.max_epochs=2", "early_stop.window=1")
    recognized = run("train_recognizer.py", project)
    assert recognized.returncode == 0, recognized.stdout + recognized.stderr
    metrics = json.loads((project / "metrics" / "recognizer.json").read_text())
    assert metrics["identities"] == 4 and 0 <= metrics["val_accuracy"] <= 1

    trained = run("train.py", project)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    runs = {
        run.info.run_name: run
        for run in client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
    }
    assert runs["train"].data.metrics["loss_id"] > 0 and "val_accuracy" in runs["train_recognizer"].data.metrics


def test_identity_is_scored_by_the_split_the_data_got(tmp_path, tiny_cache, write_params):
    """Numbered frames in one folder per person, split by sequence: each person is one sequence, so the test people
    are never seen in training, whatever split_by's name suggests. Identity is then verification, not naming."""
    settings = ("preprocess.split_by=sequence", "preprocess.test_fraction=0.5", "recognizer.epochs=2")
    params = load_params(write_params(tmp_path, *settings))
    index, _ = ingest(tiny_cache.parent / "raw", "pairs", params.ingest)
    build_cache(index, params.preprocess, params.ingest.max_pixels, tmp_path / "data" / "cache", on_error="fail")
    people = {split: set(np.load(tmp_path / "data" / "cache" / f"{split}_identity.npy").tolist()) for split in SPLITS}
    assert len(people["test"]) > 1 and not people["test"] & people["train"]  # the case this test is about

    recognized = run("train_recognizer.py", tmp_path, "--set", "recognizer.batch_size=2")
    assert recognized.returncode == 0, recognized.stderr
    assert "not measured (preprocess.split_by sequence put people in the validation split" in recognized.stdout
    save_tiny_generator(tmp_path / "models" / "generator.pt", tmp_path / "data" / "cache")
    evaluated = run("evaluate.py", tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    identity = read_record(tmp_path / EVAL_METRICS, tmp_path / EVAL_REPORT)["identity"]
    assert identity["score"] == "verification_auc" and "no test person appears in the training split" in identity["why"]
    assert 0 <= identity["real_visible"] <= 1
