"""What `make demo` says last about the record git holds (dvc.lock, metrics/, reports/): nothing when the run
reproduced it, two lines when this machine made a record of its own (another CPU kind trains other weights), and one
when it put back committed files that a stopped stage had removed; and, when other processes kept the cores busy
while the model was trained, the training's own notice again, since it scrolled away long before.

    python -m thermal2visible.demo_record

DVC removes a stage's outputs before it runs the stage, and git, not DVC's cache, holds the `cache: false` ones
(metrics/, reports/): a stage stopped halfway (Ctrl-C, an error) leaves them deleted. Putting the committed ones back
loses nothing, and leaves the pipeline as consistent as it was: dvc.lock still records them for that stage.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from thermal2visible import paths
from thermal2visible.tracking.digests import GENERATOR_DIGEST, file_digest
from thermal2visible.tracking.store import tracking_uri
from thermal2visible.training.threads import BUSY_TAG

RECORD = ("dvc.lock", "data/dvc.lock", "metrics", "reports")


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True)


def tracked(*args: str) -> list[str]:
    """The record's files a git command lists, one per line."""
    return git(*args, "--", *RECORD).stdout.splitlines()


def psnr_of(text: str) -> float | None:
    try:
        return float(json.loads(text)["generator"]["psnr"])
    except (ValueError, KeyError, TypeError):
        return None


def put_back_deleted() -> str | None:
    deleted = tracked("ls-files", "--deleted")
    if not deleted or git("checkout", "--", *deleted).returncode != 0:
        return None
    shown = ", ".join(deleted[:3]) + (f" and {len(deleted) - 3} more" if len(deleted) > 3 else "")
    return f"Put back {len(deleted)} committed file(s) that a stopped stage had removed: {shown}."


def record_lines() -> list[str]:
    changed = tracked("diff", "--name-only", "HEAD")
    if not changed:
        return []
    parts = [part for part in RECORD if any(name == part or name.startswith(f"{part}/") for name in changed)]
    committed = psnr_of(git("show", f"HEAD:{paths.EVAL_METRICS.as_posix()}").stdout)
    here = psnr_of(paths.EVAL_METRICS.read_text()) if paths.EVAL_METRICS.is_file() else None
    scores = f": test PSNR {here:.2f} dB here, {committed:.2f} dB committed" if None not in (here, committed) else ""
    return [
        f"The record is now this machine's ({', '.join(parts)} differ from the committed ones; another CPU kind "
        f"trains other weights){scores}.",
        f"Commit it to keep it, or go back to the committed record: git checkout -- {' '.join(parts)}",
    ]


def busy_notice() -> str | None:
    """The notice of the training that wrote models/generator.pt (its MLflow run's tag), if other processes kept
    its cores busy."""
    if not paths.GENERATOR.is_file():
        return None
    from mlflow import MlflowClient  # here: only a finished demo pays for MLflow's import

    uri = tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None
    client = MlflowClient(uri)
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    found = client.search_runs(
        experiments, f"tags.{GENERATOR_DIGEST} = '{file_digest(paths.GENERATOR)}'", order_by=["start_time DESC"]
    )
    notice = next((run.data.tags[BUSY_TAG] for run in found if BUSY_TAG in run.data.tags), None)
    return f"While it trained, {notice}." if notice else None


def main() -> int:
    try:
        if git("rev-parse", "--verify", "--quiet", "HEAD").returncode != 0:
            return 0  # not a git clone, or nothing committed yet: no record to compare with
    except FileNotFoundError:
        return 0  # no git
    lines = [line for line in (put_back_deleted(), *record_lines(), busy_notice()) if line]
    if lines:
        print("\n" + "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
