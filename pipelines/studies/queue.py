"""Study configurations as DVC experiments: each queued with `dvc exp run --queue`, all run by `dvc queue start -j N`,
and read back from `dvc exp show --json` (the metrics/train.json each experiment committed). Each experiment runs in
DVC's own copy of the project, so the user's params.yaml and outputs stay as they were."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from thermal2visible.errors import PipelineError
from thermal2visible.dvc_experiment import dvc_command, this_python_first

DVC = shutil.which("dvc", path=str(Path(sys.executable).parent)) or "dvc"
UNFINISHED = ("Queued", "Running")


def dvc(args: list[str], project: Path) -> str:
    env = this_python_first(os.environ)
    result = subprocess.run([DVC, *args], cwd=project, capture_output=True, text=True, env=env)
    if result.returncode:
        raise PipelineError(f"dvc {' '.join(args)} failed in {project}:\n{(result.stdout + result.stderr)[-2000:]}")
    return result.stdout


def require_repository(project: Path) -> None:
    """PipelineError unless `project` is a DVC project in git with a commit: what queued experiments start from."""
    head = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=project, capture_output=True)
    if head.returncode or not (project / ".dvc").is_dir():
        raise PipelineError(
            f"{project.resolve()}: DVC's queue runs experiments from a git commit of a DVC project; run it in a clone "
            "of this project (git clone, then make demo)"
        )


def queue(project: Path, name: str, stage: str, settings: list[str]) -> None:
    dvc(dvc_command(stage, settings, queue=True, name=name)[1:], project)


def status(project: Path) -> dict[str, str]:
    """{experiment name: status} from `dvc queue status`'s table (it has no JSON form)."""
    lines = dvc(["queue", "status"], project).splitlines()
    rows = [line.split() for line in lines[1 : lines.index("")]] if "" in lines else []
    return {row[1]: row[-1] for row in rows if len(row) >= 3}


def run_queue(project: Path, names: list[str], jobs: int) -> dict[str, dict]:
    """Start `jobs` workers, wait until every experiment in `names` has finished and the workers have left; each
    experiment's entry in `dvc exp show --json` (its params, deps, outs and metrics)."""
    dvc(["queue", "start", "-j", str(jobs)], project)
    try:
        return wait_for(project, names)
    finally:
        wait_for_workers(project)


def wait_for(project: Path, names: list[str]) -> dict[str, dict]:
    """Each experiment's entry in `dvc exp show --json` once all of `names` have finished; PipelineError naming the
    ones that failed, with the end of their logs."""
    done: set[str] = set()
    while True:
        states = {name: state for name, state in status(project).items() if name in names}
        lost = sorted(set(names) - set(states))
        if lost:
            raise PipelineError(f"no longer in dvc queue status: {', '.join(lost)}")
        for name in sorted(set(states) - done):
            if states[name] not in UNFINISHED:
                print(f"  {name}: {states[name]}", flush=True)
                done.add(name)
        if len(done) == len(names):
            break
        time.sleep(2)
    failed = [name for name in names if states[name] != "Success"]
    if failed:
        logs = "".join(f"\n--- {name}:\n" + dvc(["queue", "logs", name], project)[-2000:] for name in failed)
        raise PipelineError(f"these experiments failed: {', '.join(failed)}{logs}")
    return shown_experiments(project, names)


def wait_for_workers(project: Path) -> None:
    """Until DVC's workers have left (10 s after their last task), so that nothing a queue started outlives it and
    no worker left over runs the next queue's tasks beside its own."""
    while "Worker status: 0 active, 0 idle" not in dvc(["queue", "status"], project):
        time.sleep(1)


def shown_experiments(project: Path, names: list[str]) -> dict[str, dict]:
    shown = {
        experiment["name"]: experiment["revs"][0]["data"]
        for baseline in json.loads(dvc(["exp", "show", "--json"], project))
        for experiment in baseline.get("experiments") or []
    }
    missing = [name for name in names if name not in shown]
    if missing:
        raise PipelineError(f"not in dvc exp show: {', '.join(missing)}")
    return {name: shown[name] for name in names}
