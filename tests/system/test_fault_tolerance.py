"""A real training run (pipelines/train.py as a subprocess) killed at chosen points, stopped by SIGTERM and by
Ctrl-C, then run to the end: one continuous run, as if it had never been interrupted.

The points are hit without hooks in the code: the test watches the files training writes, freezes the process
(SIGSTOP) the moment a marker appears, checks from the files where the frozen process really is, and SIGKILLs
it there (or lets it go on and tries again in a later epoch):
  during checkpoint write  checkpoints/last.ckpt.<pid>.tmp exists and last.ckpt still holds the epoch before
  during validation        the epoch's validation image is logged and its checkpoint not begun
  just after a checkpoint  a new last.ckpt is there and its epoch's validation metrics are not yet in MLflow (they
                           are logged once the checkpoint is on disk; the resumed run logs them from the checkpoint)
  mid-epoch                training the next epoch: its checkpointed predecessor's losses are in MLflow (they are
                           logged just after the checkpoint) and its own validation has not begun
The kill just after a checkpoint also hits the one gap left (tracking.CheckpointedMLFlowLogger): that epoch's
training losses, which Lightning logs after the checkpoint, are lost from MLflow (never duplicated).
"""

import csv
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from thermal2visible.training.early_stopping import PsnrEarlyStopping

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
EPOCHS, WINDOW = 100, 2  # tiny epochs take 0.1-0.2 s, and a point missed is tried again in a later epoch:
# enough of them for every interruption to land mid-run, whatever the speed of the CPU


def start(project: Path, name: str, *args: str) -> subprocess.Popen:
    log = (project / f"{name}.log").open("w")
    return subprocess.Popen(
        [sys.executable, str(REPO / "pipelines" / "train.py"), *args],
        cwd=project,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def output(project: Path, name: str) -> str:
    return (project / f"{name}.log").read_text()


def early_stop_state(checkpoint: dict) -> dict:
    return next(state for key, state in checkpoint["callbacks"].items() if "PsnrEarlyStopping" in key)


def checkpointed_epochs(project: Path, _seen: dict = {}) -> int:
    """Epochs of PSNR history in checkpoints/last.ckpt (0 before the first), read again only when the file changed
    (the test polls it in a tight loop)."""
    path = project / "checkpoints" / "last.ckpt"
    try:
        stat = path.stat()
    except FileNotFoundError:
        return 0
    version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
    if _seen.get(path, (None,))[0] != version:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        _seen[path] = version, len(early_stop_state(checkpoint)["history"])
    return _seen[path][1]


def validation_logged(project: Path, epoch: int) -> bool:
    """The image grid ImageGridLogger logs at the first validation batch of `epoch` (image_log_every=1)."""
    return any(project.glob(f"mlruns/*/*/artifacts/images/val_grid+step+{epoch}+*.png"))


def modified(path: Path) -> int | None:
    """st_mtime_ns, or None when the file is not there (a temporary file can vanish at any moment)."""
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return None


def in_mlflow(project: Path, key: str, epoch: int) -> bool | None:
    """Whether the run has metric `key` at step `epoch`; None while the frozen process holds the store's write
    lock (it was frozen while logging)."""
    try:
        with sqlite3.connect(project / "mlflow.db", timeout=0.5) as db:
            return db.execute("SELECT 1 FROM metrics WHERE key = ? AND step = ?", (key, epoch)).fetchone() is not None
    except sqlite3.OperationalError:  # "database is locked"
        return None


def kill_at(process: subprocess.Popen, project: Path, point: str) -> int:
    """SIGKILL `process` at `point`; returns the epochs in last.ckpt then."""
    temporary = project / "checkpoints" / f"last.ckpt.{process.pid}.tmp"  # the training writes it, then renames it
    stale = modified(temporary)
    deadline, last_seen = time.monotonic() + 240, (0, time.monotonic())  # (epochs, when they were first seen)
    while time.monotonic() < deadline:
        assert process.poll() is None, "training ended before the point was hit"
        done = checkpointed_epochs(project)
        new_checkpoint = done != last_seen[0]
        if new_checkpoint:
            last_seen = (done, time.monotonic())
        if point == "after checkpoint":
            marker = new_checkpoint and done >= 1
        elif point == "checkpoint":
            marker = modified(temporary) not in (None, stale) and done >= 1
        elif point == "validation":
            marker = done >= 1 and validation_logged(project, done + 1)
        else:  # mid-epoch: a while (a quarter of a tiny epoch) after a checkpoint
            marker = done >= 1 and time.monotonic() - last_seen[1] > 0.05
        if not marker:
            continue
        process.send_signal(signal.SIGSTOP)
        frozen_in_write = modified(temporary) not in (None, stale)
        there = {
            "after checkpoint": not frozen_in_write and not in_mlflow(project, "val_psnr", done),
            "checkpoint": frozen_in_write,
            "validation": not frozen_in_write and validation_logged(project, done + 1),
            "mid-epoch": not frozen_in_write
            and not validation_logged(project, done + 1)
            and in_mlflow(project, "loss_g", done) is True,
        }[point]
        if there and checkpointed_epochs(project) == done:
            process.kill()
            process.wait()
            return done
        process.send_signal(signal.SIGCONT)  # it moved on before it froze: try in a later epoch
        last_seen = (checkpointed_epochs(project), time.monotonic())
    raise AssertionError(f"never frozen at {point}")


def interrupt_after(process: subprocess.Popen, project: Path, epochs: int, how: signal.Signals) -> int:
    while checkpointed_epochs(project) < epochs:
        assert process.poll() is None, "training ended before the signal"
        time.sleep(0.01)
    process.send_signal(how)
    assert process.wait(timeout=120) == 1
    return checkpointed_epochs(project)


def assert_consistent_on_disk(project: Path) -> None:
    """What a kill left behind: a whole last.ckpt, and a best file that the resumed run agrees with (the best
    epoch's file, or about to be rewritten from the checkpoint's own weights when the best is its last epoch)."""
    state = early_stop_state(torch.load(project / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True))
    best = project / "checkpoints" / "best_generator.pt"
    if best.exists():
        kept = torch.load(best, map_location="cpu", weights_only=True)["epoch"]
        assert kept == state["best_epoch"] or state["best_epoch"] == len(state["history"]), (kept, state)


@pytest.mark.timeout(600)
def test_kills_at_every_point_then_signals_then_completion_make_one_continuous_run(tmp_path, tiny_cache, write_params):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cache").symlink_to(tiny_cache)
    write_params(
        tmp_path,
        f"train.max_epochs={EPOCHS}",
        f"early_stop.window={WINDOW}",
        f"early_stop.patience={EPOCHS}",
        "train.image_log_every=1",
        "train.batch_size=2",
    )

    reached, losses_lost_at = 0, None
    for run, point in enumerate(("checkpoint", "validation", "after checkpoint", "mid-epoch")):
        process = start(tmp_path, f"run{run}")
        killed_at = kill_at(process, tmp_path, point)
        losses_lost_at = killed_at if point == "after checkpoint" else losses_lost_at
        assert killed_at >= reached  # continued, never went back
        assert_consistent_on_disk(tmp_path)
        if point == "checkpoint":
            assert (tmp_path / "checkpoints" / f"last.ckpt.{process.pid}.tmp").exists()  # the next run ignores it
        reached = killed_at

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    for run, how, said in ((4, signal.SIGTERM, "SIGTERM"), (5, signal.SIGINT, "Ctrl-C")):
        stopped_at = interrupt_after(start(tmp_path, f"run{run}"), tmp_path, reached + 2, how)
        message = output(tmp_path, f"run{run}")
        assert (
            f"stopped by {said} after epoch {stopped_at}; checkpoints/last.ckpt holds epochs "
            f"1-{stopped_at}: run again to continue"
            in message
            and "Traceback" not in message
        ), message
        assert ("Received SIGTERM" in message) == (how == signal.SIGTERM), message  # a Ctrl-C is told as one
        assert not (tmp_path / "models" / "generator.pt").exists()  # published only by a finished run
        [stopped] = client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
        assert stopped.info.status == "KILLED"  # stopped, to be continued: not a failure
        reached = stopped_at

    final = start(tmp_path, "run6")
    assert final.wait(timeout=300) == 0, output(tmp_path, "run6")
    assert "continued from checkpoints/last.ckpt" in output(tmp_path, "run6")

    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best_generator.pt", "last.ckpt", "lock"]
    with (tmp_path / "metrics" / "psnr.csv").open() as file:
        assert [int(row["epoch"]) for row in csv.DictReader(file)] == list(range(1, EPOCHS + 1))

    # The early-stopping state is exactly what an uninterrupted run makes of the same PSNR history.
    state = early_stop_state(torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True))
    replay = PsnrEarlyStopping(WINDOW, EPOCHS)
    for psnr in state["history"]:
        replay.observe(psnr)
    assert replay.state_dict() == state and len(state["history"]) == EPOCHS
    summary = (tmp_path / "metrics" / "train.json").read_text()
    assert f'"best_epoch": {replay.best_epoch},' in summary and f'"stopped_epoch": {EPOCHS},' in summary
    published = torch.load(tmp_path / "models" / "generator.pt", weights_only=True)
    assert published["epoch"] == replay.best_epoch and published["psnr_smoothed"] == replay.best_smoothed

    # One MLflow run, continued by every process; each metric logged once per epoch, from the kept timeline.
    runs = client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    for key in runs[0].data.metrics:
        steps = sorted(metric.step for metric in client.get_metric_history(runs[0].info.run_id, key))
        expected = list(range(WINDOW if key == "val_psnr_smoothed" else 1, EPOCHS + 1))  # smoothed from the window
        if not key.startswith("val_"):  # logged after the checkpoint: the kill just after one may have lost them
            expected = [step for step in expected if step != losses_lost_at or step in steps]
        assert steps == expected, (key, steps)
    logged = sorted(client.get_metric_history(runs[0].info.run_id, "val_psnr"), key=lambda metric: metric.step)
    assert [metric.value for metric in logged] == pytest.approx(state["history"], abs=1e-6)
    smoothed = sorted(client.get_metric_history(runs[0].info.run_id, "val_psnr_smoothed"), key=lambda m: m.step)
    assert [metric.value for metric in smoothed] == pytest.approx(replay.smoothed()[WINDOW - 1 :], abs=1e-6)


def tiny_project(root: Path, tiny_cache: Path, write_params, *overrides: str) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "data" / "cache").symlink_to(tiny_cache)
    write_params(root, *overrides)
    return root


@pytest.mark.timeout(300)
def test_unreadable_last_checkpoint_gives_a_notice_and_a_fresh_start(tmp_path, tiny_cache, write_params):
    project = tiny_project(tmp_path, tiny_cache, write_params, "early_stop.window=1")
    (project / "checkpoints").mkdir()
    (project / "checkpoints" / "last.ckpt").write_bytes(b"PK\x03\x04" + bytes(100))  # a zip cut short
    run = start(project, "run")
    assert run.wait(timeout=240) == 0, output(project, "run")
    assert "notice: checkpoints/last.ckpt cannot be read" in output(project, "run") and "starting fresh" in output(
        project, "run"
    )
    assert checkpointed_epochs(project) == 2  # trained from epoch 1, checkpoint rewritten whole


@pytest.mark.timeout(300)
def test_diverging_training_stops_clearly_and_publishes_nothing(tmp_path, tiny_cache, write_params):
    """A learning rate of 1e30 makes every loss non-finite after the first step: the run must stop after
    train.max_bad_steps skipped steps, leaving the published model and the registry as they were."""
    project = tiny_project(
        tmp_path,
        tiny_cache,
        write_params,
        "early_stop.window=1",
        "train.lr_g=1.0e+30",
        "train.lr_d=1.0e+30",
        "train.max_bad_steps=3",
    )
    published = project / "models" / "generator.pt"
    published.parent.mkdir()
    published.write_bytes(b"the model of an earlier, good run")
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    client.create_registered_model("thermal2visible")
    client.create_model_version("thermal2visible", source=str(project / "models"))
    client.set_registered_model_alias("thermal2visible", "champion", "1")

    run = start(project, "run")
    assert run.wait(timeout=240) == 1
    message = output(project, "run")
    assert "error: training diverged: 4 steps with a non-finite loss or gradient (train.max_bad_steps = 3)" in message
    assert "Traceback" not in message
    assert published.read_bytes() == b"the model of an earlier, good run"
    assert [int(v.version) for v in client.search_model_versions("name='thermal2visible'")] == [1]
    assert {
        alias: int(version) for alias, version in client.get_registered_model("thermal2visible").aliases.items()
    } == {"champion": 1}
    runs = client.search_runs([client.get_experiment_by_name("thermal2visible").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]
