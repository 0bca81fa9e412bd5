"""The workspace stays bounded: parked resume state beyond train.keep_parked_runs goes when a training starts, and
`make reclaim` gives back everything the project can rebuild, saying what it freed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from thermal2visible.config.load import load_params
from thermal2visible.training.parked_runs import prune_parked, size_of

REPO = Path(__file__).resolve().parents[2]


def parked(folder: Path, name: str, size: int, age: float) -> Path:
    """A parked run's folder holding `size` bytes, last used `age` seconds ago."""
    (folder / name).mkdir(parents=True)
    (folder / name / "last.ckpt").write_bytes(b"x" * size)
    when = time.time() - age
    for path in (folder / name / "last.ckpt", folder / name):
        os.utime(path, (when, when))
    return folder / name


def test_the_oldest_parked_runs_go_and_nothing_else(tmp_path, capsys):
    checkpoints, outside = tmp_path / "checkpoints", tmp_path / "elsewhere"
    newest, newer = parked(checkpoints, "a" * 16, 10, 10), parked(checkpoints, "unreadable", 10, 20)
    old, oldest = parked(checkpoints, "c" * 16, 1_000_000, 30), parked(checkpoints, "d" * 16, 500_000, 40)
    running = parked(checkpoints, "e" * 16, 10, 100)  # the running fingerprint's: never pruned, however old
    linked = parked(outside, "f" * 16, 10, 200)
    (checkpoints / ("f" * 16)).symlink_to(linked)  # named as a parked run, but leads out of checkpoints/
    (checkpoints / "last.ckpt").write_bytes(b"current")
    (checkpoints / "notes").mkdir()  # named as no parked run
    parked(checkpoints, "0" * 15, 10, 300)  # 15 digits: no fingerprint
    (checkpoints / ("1" * 16)).mkdir()  # empty: what a run taken back out of its folder leaves

    assert prune_parked(checkpoints, running.name, 2) == [old.name, oldest.name]
    line = capsys.readouterr().out
    assert line == (
        f"notice: {checkpoints}: removed 2 parked run(s) (fingerprints {old.name}, {oldest.name}; 1.5 MB) beyond "
        "train.keep_parked_runs 2\n"
    )
    assert newest.is_dir() and newer.is_dir() and running.is_dir() and not old.exists() and not oldest.exists()
    assert (linked / "last.ckpt").is_file() and (checkpoints / ("f" * 16)).is_symlink()
    assert (checkpoints / "last.ckpt").is_file() and (checkpoints / "notes").is_dir()
    assert (checkpoints / ("0" * 15)).is_dir() and (checkpoints / ("1" * 16)).is_dir()
    assert prune_parked(checkpoints, running.name, 2) == [] and capsys.readouterr().out == ""
    assert prune_parked(checkpoints, running.name, 0) == [newest.name, newer.name]


def train(project: Path, write_params, *overrides: str) -> str:
    write_params(project, "train.max_epochs=1", *overrides)
    done = subprocess.run(
        [sys.executable, str(REPO / "pipelines" / "train.py")], cwd=project, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def runs_in(checkpoints: Path) -> dict[str, int]:
    """Each run whose resume state lies in `checkpoints` (the current one as "current") -> its bytes."""
    runs = {"current": size_of(checkpoints / "last.ckpt") + size_of(checkpoints / "best_generator.pt")}
    return runs | {folder.name: size_of(folder) for folder in checkpoints.iterdir() if (folder / "last.ckpt").is_file()}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_twelve_trainings_leave_checkpoints_within_the_bound(tmp_path, tiny_cache, write_params):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cache").symlink_to(tiny_cache)
    fingerprints, biggest = [], 0
    for seed in range(12):
        output = train(tmp_path, write_params, f"train.seed={seed}")
        fingerprints.append(re.search(r"written \(fingerprint ([0-9a-f]{16})\)", output)[1])
        keep = load_params(tmp_path / "params.yaml").train.keep_parked_runs
        runs = runs_in(tmp_path / "checkpoints")
        assert len(runs) == min(seed + 1, keep + 1), runs
        assert set(runs) - {"current"} == set(fingerprints[-keep - 1 : -1])  # the most recently used
        biggest = max(biggest, *runs.values())
        # the documented bound: keep_parked_runs + 1 runs of a last.ckpt and a best_generator.pt each
        assert size_of(tmp_path / "checkpoints") <= (keep + 1) * biggest + 4096
        if seed > keep:
            gone = fingerprints[seed - keep - 1]
            assert re.search(
                rf"^notice: checkpoints: removed 1 parked run\(s\) \(fingerprints {gone}; [0-9.]+ MB\) beyond "
                rf"train\.keep_parked_runs {keep}$",
                output,
                re.MULTILINE,
            ), output
        else:
            assert "removed" not in output
    # a kept run continues where it stopped, and the run it displaces is parked in turn, within the bound
    output = train(tmp_path, write_params, "train.seed=10", "train.max_epochs=2")
    assert f"continuing this run's own from checkpoints/{fingerprints[10]}" in output
    assert "(continued from checkpoints/last.ckpt)" in output
    assert set(runs_in(tmp_path / "checkpoints")) == {"current", fingerprints[9], fingerprints[11]}


def run(command: list[str], cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_reclaim_frees_what_it_says(tmp_path):
    import mlflow
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    dvc = str(Path(sys.executable).with_name("dvc"))
    run(["git", "init", "-q"], tmp_path)
    run([dvc, "init", "-q"], tmp_path)
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(300_000))
    run([dvc, "add", "-q", "data.bin"], tmp_path)
    data.write_bytes(os.urandom(200_000))  # the first version is in the cache, used by nothing any more
    run([dvc, "add", "-q", "data.bin"], tmp_path)

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("thermal2visible", artifact_location=str(tmp_path / "mlruns"))
    kept, deleted = (client.create_run(experiment).info.run_id for _ in range(2))
    for run_id, size in ((kept, 50_000), (deleted, 400_000)):
        (tmp_path / f"{run_id}.bin").write_bytes(os.urandom(size))
        client.log_artifact(run_id, str(tmp_path / f"{run_id}.bin"))
        client.set_terminated(run_id)
    client.delete_run(deleted)
    mlflow.set_tracking_uri(None)

    (tmp_path / "checkpoints" / ("a" * 16)).mkdir(parents=True)
    (tmp_path / "checkpoints" / ("a" * 16) / "last.ckpt").write_bytes(b"x" * 700_000)
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"x" * 100_000)

    output = run([sys.executable, "-m", "thermal2visible.reclaim"], tmp_path)
    assert "reclaim: removing checkpoints/ (0.8 MB: the resume state of 2 run(s), current and parked;" in output
    assert "1 deleted MLflow run(s)" in output and "(0.4 MB of artifacts)" in output
    assert output.splitlines()[-1] == (
        "reclaim: freed 1.5 MB (checkpoints 0.8 MB, DVC cache 0.3 MB, deleted MLflow runs 0.4 MB)"
    ), output
    assert not (tmp_path / "checkpoints").exists()
    cache = [path for path in (tmp_path / ".dvc" / "cache").rglob("*") if path.is_file()]
    assert [path.stat().st_size for path in cache] == [200_000]  # the workspace's version stays
    assert [run.info.run_id for run in client.search_runs([experiment], run_view_type=ViewType.ALL)] == [kept]
    assert not any((tmp_path / "mlruns").rglob(f"{deleted}.bin")) and any((tmp_path / "mlruns").rglob(f"{kept}.bin"))
    # and once more: nothing left to free
    assert run([sys.executable, "-m", "thermal2visible.reclaim"], tmp_path).splitlines()[-1] == (
        "reclaim: freed 0.0 MB (checkpoints 0.0 MB, DVC cache 0.0 MB, deleted MLflow runs 0.0 MB)"
    )


def test_make_reclaim_runs_the_reclaim_command():
    dry = subprocess.run(["make", "-n", "reclaim"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "-m thermal2visible.reclaim" in dry
