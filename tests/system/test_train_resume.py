"""A real training run killed with SIGKILL, then stopped with SIGTERM, then run to the end: one continuous run.

Each interruption hits pipelines/train.py as a subprocess at a random point in an epoch; the next invocation
must continue from checkpoints/last.ckpt with the same MLflow run, no epoch repeated or skipped, the complete PSNR
history, and the very weights of a run that was never interrupted. Which params keep last.ckpt and which start
afresh is tested here too.
"""

import csv
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from thermal2visible.config.load import load_params

from thermal2visible.config.stored import marked

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
EPOCHS = 40  # tiny epochs take ~0.1 s: enough of them that each interruption lands mid-run


def start(project: Path, *args: str) -> subprocess.Popen:
    """train.py in its own session: a SIGKILL of its process group reaches every DDP rank, as a node failure would."""
    return subprocess.Popen(
        [sys.executable, str(REPO / "pipelines" / "train.py"), *args],
        cwd=project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def epochs_in_checkpoint(project: Path) -> int:
    """Epochs of PSNR history in checkpoints/last.ckpt (0 before the first one)."""
    path = project / "checkpoints" / "last.ckpt"
    if not path.is_file():
        return 0
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return len(next(state["history"] for key, state in checkpoint["callbacks"].items() if "PsnrEarlyStopping" in key))


def finish(process: subprocess.Popen) -> str:
    """The output of a run that must end normally (read while it runs: a full pipe would block it)."""
    output = process.communicate(timeout=240)[0]
    assert process.returncode == 0, output
    return output


def interrupt_after(process: subprocess.Popen, project: Path, epochs: int, how: signal.Signals) -> str:
    deadline = time.monotonic() + 180
    while epochs_in_checkpoint(project) < epochs:
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, "training made no progress"
        time.sleep(0.02)
    if how == signal.SIGKILL:
        os.killpg(process.pid, how)
    else:
        process.send_signal(how)
    return process.communicate(timeout=120)[0]


SETTINGS = (
    f"train.max_epochs={EPOCHS}",
    "early_stop.window=2",
    f"early_stop.patience={EPOCHS}",
    "train.image_log_every=3",
    "train.batch_size=2",
)


def project(root: Path, tiny_cache: Path, write_params, *overrides: str) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "data" / "cache").symlink_to(tiny_cache)
    write_params(root, *SETTINGS, *overrides)
    return root


def trained_state(project: Path) -> dict:
    """Weights (with batch-norm statistics) and optimizer states of the last checkpoint."""
    checkpoint = torch.load(project / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    return {"weights": checkpoint["state_dict"], "optimizers": checkpoint["optimizer_states"]}


def assert_equal_states(a, b, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_equal_states(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b)):
            assert_equal_states(x, y, f"{where}/{index}")
    else:
        assert a == b, where


@pytest.mark.timeout(500)
def test_killed_and_terminated_runs_continue_where_they_stopped(tmp_path, tiny_cache, write_params):
    from mlflow import MlflowClient

    uninterrupted = start(project(tmp_path / "uninterrupted", tiny_cache, write_params))
    finish(uninterrupted)
    tmp_path = project(tmp_path / "interrupted", tiny_cache, write_params)

    first = start(tmp_path)
    interrupt_after(first, tmp_path, 3, signal.SIGKILL)
    assert first.returncode == -signal.SIGKILL
    killed_at = epochs_in_checkpoint(tmp_path)

    second = start(tmp_path)
    output = interrupt_after(second, tmp_path, killed_at + 2, signal.SIGTERM)
    assert second.returncode == 1 and "stopped by SIGTERM" in output and "Traceback" not in output, output
    assert not (tmp_path / "models" / "generator.pt").exists()  # published only by a finished run

    third = start(tmp_path)
    output = third.communicate(timeout=240)[0]
    assert third.returncode == 0, output
    assert "continued from checkpoints/last.ckpt" in output

    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == [
        "best_generator.pt",
        "last.ckpt",
        "lock",
    ]
    with (tmp_path / "metrics" / "psnr.csv").open() as file:
        epochs = [int(row["epoch"]) for row in csv.DictReader(file)]
    assert epochs == list(range(1, EPOCHS + 1))  # every epoch once, across three processes

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_psnr")]
    # A kill between logging an epoch's PSNR and checkpointing it makes that epoch run (and log) twice.
    assert sorted(set(steps)) == list(range(1, EPOCHS + 1)) and len(steps) <= EPOCHS + 2
    # Each resumed process draws the random numbers (shuffles, crops, flips, dropout) the uninterrupted one drew.
    assert_equal_states(trained_state(tmp_path), trained_state(tmp_path.parent / "uninterrupted"))


@pytest.mark.timeout(300)
def test_only_params_that_define_the_weights_start_afresh(tmp_path, tiny_cache, write_params):
    short = ("train.max_epochs=2", "early_stop.window=1")
    root = project(tmp_path, tiny_cache, write_params, *short)
    finish(start(root))
    write_params(
        root,
        *SETTINGS,
        *short,
        "train.image_log_every=1",
        "loader.num_workers=1",
        "loader.pin_memory=true",
        "loader.preload=false",
        "model.recompute=true",
    )
    assert "continued from checkpoints/last.ckpt" in finish(start(root))
    first = torch.load(root / "checkpoints" / "last.ckpt", weights_only=True)["thermal2visible_run"]["fingerprint"]
    write_params(root, *SETTINGS, *short, "loader.jitter=false")
    output = finish(start(root))
    assert f"is another run's (fingerprint {first}): kept in checkpoints/{first}" in output, output
    assert "continued from" not in output and (root / "checkpoints" / first / "last.ckpt").is_file()
    # and back: the first settings continue their own kept checkpoint, and the second settings' is kept in turn
    write_params(root, *SETTINGS, *short)
    output = finish(start(root))
    assert "continued from checkpoints/last.ckpt" in output and not list((root / "checkpoints" / first).glob("*.ckpt"))
    assert len(list((root / "checkpoints").glob("*/last.ckpt"))) == 1


@pytest.mark.timeout(300)
def test_a_second_training_of_one_folder_is_refused_naming_the_first(tmp_path, tiny_cache, write_params):
    root = project(tmp_path, tiny_cache, write_params, "train.max_epochs=2", "early_stop.window=1")
    (root / "checkpoints").mkdir()
    with open(root / "checkpoints" / "lock", "w") as lock:  # what a training in progress holds
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write(f"{os.getpid()} 0123456789abcdef\n")
        lock.flush()
        refused = start(root)
        output = refused.communicate(timeout=120)[0]
    assert refused.returncode == 1 and "Traceback" not in output, output
    assert f"another training is using it (PID {os.getpid()}, fingerprint 0123456789abcdef)" in output
    assert not (root / "checkpoints" / "last.ckpt").exists()
    finish(start(root))  # once it is free


@pytest.mark.timeout(300)
def test_a_run_whose_process_died_before_its_first_checkpoint_is_marked_killed(tmp_path, tiny_cache, write_params):
    from mlflow import MlflowClient

    root = project(tmp_path, tiny_cache, write_params, "train.max_epochs=2", "early_stop.window=1")
    gone = subprocess.Popen(["true"])
    gone.wait()
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.create_experiment("thermal2visible")
    tags = {"host": socket.gethostname(), "pid": str(gone.pid)}
    abandoned = client.create_run(experiment, run_name="train", tags=tags).info.run_id
    alive = client.create_run(experiment, run_name="train", tags=tags | {"pid": str(os.getpid())}).info.run_id
    output = finish(start(root))
    assert f"marked KILLED the train run(s) whose process had died: {abandoned}" in output
    assert client.get_run(abandoned).info.status == "KILLED" and client.get_run(alive).info.status == "RUNNING"


@pytest.mark.timeout(400)
@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(
            ("train.devices=2", "train.batch_size=4", "train.ema_half_life_images=16"),
            id="two DDP processes over gloo, moving-average generator",
        ),
        pytest.param(
            ("model.generator=resnet", "model.discriminator_settings.scales=2", "train.lambda_feat=10"),
            id="ResNet generator, 2-scale D, feature matching",
        ),
    ],
)
def test_a_killed_run_resumes_to_the_uninterrupted_weights(tmp_path, tiny_cache, write_params, overrides):
    """(Resuming into loader workers, reading per batch, is the run-only keys' test below.)"""
    settings = ("train.max_epochs=6", *overrides)
    uninterrupted = project(tmp_path / "uninterrupted", tiny_cache, write_params, *settings)
    finish(start(uninterrupted))
    interrupted = project(tmp_path / "interrupted", tiny_cache, write_params, *settings)
    interrupt_after(start(interrupted), interrupted, 2, signal.SIGKILL)
    assert 2 <= epochs_in_checkpoint(interrupted) < 6
    assert "continued from checkpoints/last.ckpt" in finish(start(interrupted))
    assert_equal_states(trained_state(interrupted), trained_state(uninterrupted))


@pytest.mark.timeout(300)
def test_a_time_budget_ends_the_run_and_a_resumed_run_spends_only_what_is_left(tmp_path, tiny_cache, write_params):
    # min_epochs 3: a slow moment of the machine cannot end the run before the moving average exists
    root = project(
        tmp_path,
        tiny_cache,
        write_params,
        "train.max_minutes=0.05",
        "train.max_epochs=1000",
        "train.min_epochs=3",
        "early_stop.patience=1000",
    )
    finish(start(root))
    stopped = json.loads((root / "metrics" / "train.json").read_text())["stopped_epoch"]
    assert 2 <= stopped < 1000  # 3 s of ~0.1 s epochs
    # The budget's clock is in the checkpoint: run again, and at most the epoch in flight is added, not 3 s more.
    assert "continued from checkpoints/last.ckpt" in finish(start(root))
    assert json.loads((root / "metrics" / "train.json").read_text())["stopped_epoch"] - stopped <= 1


@pytest.mark.timeout(120)
def test_a_budget_that_ends_before_the_moving_average_exists_is_refused(tmp_path, tiny_cache, write_params):
    root = project(tmp_path, tiny_cache, write_params, "train.max_minutes=0.0001", "early_stop.window=5")
    process = start(root)
    output = process.communicate(timeout=100)[0]
    assert process.returncode == 1 and "Traceback" not in output, output
    assert "no model to keep: train.max_minutes (0.0001) ran out after 1 epoch(s)" in output
    assert not (root / "models").exists() and not (root / "metrics").exists()


def run_only_changes() -> list[str]:
    """Every run-only key (the schema's marks) set away from its shipped value, to one this CPU runs. `resume`
    decides whether a run continues at all; `accelerator` and `strategy` can only name what `auto` already picks on
    one CPU process."""
    shipped_params = load_params(REPO / "params.yaml")
    other = {bool: lambda value: not value, int: lambda value: value + 1, float: lambda value: value / 2}
    changes = []
    for section in ("loader", "model", "train"):
        for key, defines_weights in marked(section, "weights").items():
            value = getattr(getattr(shipped_params, section), key)
            if defines_weights or key in marked(section, "stops") or key == "resume":
                continue
            if key == "accelerator":
                changes.append("train.accelerator=cpu")
            elif key == "strategy":
                changes.append("train.strategy=auto")
            elif key == "preload":  # auto preloads the tiny split: read it per batch instead
                changes.append("loader.preload=false")
            else:
                changes.append(f"{section}.{key}={json.dumps(other[type(value)](value))}")
    return changes


@pytest.mark.timeout(300)
def test_how_data_is_loaded_changes_no_weight(tmp_path, tiny_cache, write_params):
    """The jitter's windows are drawn in the main process from the run's stream: loader workers and preloading
    leave the trained weights exactly as they are (run-only keys, outside the fingerprint)."""
    states = []
    for name, overrides in {
        "in memory": ("loader.preload=true", "loader.num_workers=0"),
        "two workers": ("loader.preload=false", "loader.num_workers=2"),
        "memory-mapped": ("loader.preload=false", "loader.num_workers=0"),
    }.items():
        root = project(tmp_path / name.replace(" ", "-"), tiny_cache, write_params, "train.max_epochs=3", *overrides)
        finish(start(root))
        states.append(trained_state(root))
    for state in states[1:]:
        assert_equal_states(state, states[0])


@pytest.mark.timeout(400)
def test_changing_every_run_only_key_mid_run_ends_with_the_same_weights(tmp_path, tiny_cache, write_params):
    settings = ("train.max_epochs=6",)
    uninterrupted = project(tmp_path / "uninterrupted", tiny_cache, write_params, *settings)
    finish(start(uninterrupted))
    interrupted = project(tmp_path / "interrupted", tiny_cache, write_params, *settings)
    interrupt_after(start(interrupted), interrupted, 2, signal.SIGKILL)
    write_params(interrupted, *SETTINGS, *settings, *run_only_changes())
    assert "continued from checkpoints/last.ckpt" in finish(start(interrupted))
    assert_equal_states(trained_state(interrupted)["weights"], trained_state(uninterrupted)["weights"])
