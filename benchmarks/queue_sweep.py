"""A batch-size sweep through DVC's queue: `dvc exp run --queue -S train.batch_size=B` for each B, then `dvc queue
start -j 1` against `-j 2`, in interleaved rounds (benchmarks/rounds.py); each round's figure is the -j 2 sweep's
wall time over the -j 1 sweep's.

The sweep runs in a fresh git + DVC project holding this project's pipeline with the tiny preset (params/tiny.yaml),
its baseline run once beforehand (`dvc repro`), as `make demo` leaves a user's clone. A sweep's time runs from
`dvc queue start` until `dvc queue status` shows every experiment done. After each sweep every experiment must be in
`dvc exp show` with its metrics, and the project's MLflow store must hold one train run tagged with its name whose
`generator_sha256` is that experiment's models/generator.pt (the link both ways); then the experiments are removed
for the next sweep.

Writes a new benchmarks/results/<date>-queue_sweep.json and .png (--report names them otherwise, --out puts them
at a path of your choice).
Usage: python -m benchmarks.queue_sweep [--batches 1 2 4 8] [--rounds 3] [--report queue_sweep] [--out PATH]
"""

import argparse
import hashlib
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import yaml  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from benchmarks.common import PROJECT, add_report_option, machine_text, publish, result_stem  # noqa: E402
from benchmarks.rounds import measure_rounds  # noqa: E402
from thermal2visible.config.load import apply_override, load_params, preset_overrides  # noqa: E402
from tests.support.projects import copy_project  # noqa: E402
from tests.support.servers import quiet_env  # noqa: E402
from thermal2visible.paths import GENERATOR  # noqa: E402
from pipelines.studies.queue import DVC, dvc, queue, wait_for, wait_for_workers  # noqa: E402

TINY = PROJECT / "params" / "tiny.yaml"


def run(command: list[str], project: Path) -> str:
    result = subprocess.run(command, cwd=project, capture_output=True, text=True, env=quiet_env())
    if result.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return result.stdout


def tiny_project(folder: Path, baseline: bool = True, settings: Sequence[str] = ()) -> Path:
    """A fresh git + DVC repo of this project's pipeline with the tiny preset and `settings` over it, committed; with
    `baseline` its pipeline also run and committed, as `make demo` leaves a user's clone."""
    copy_project(folder)
    params = yaml.safe_load((PROJECT / "params.yaml").read_text())
    for override in (*preset_overrides(TINY), *settings):
        apply_override(params, override)
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    commit = ["git", "-c", "user.name=benchmark", "-c", "user.email=benchmark@localhost", "commit", "-qm", "sweep"]
    for command in (["git", "init", "-q"], [DVC, "init", "-q"], ["git", "add", "-A"], commit):
        run(command, folder)
    if baseline:  # a sweep re-runs only what a batch changes
        run([DVC, "repro"], folder)
        run(["git", "add", "-A"], folder)
        run(commit[:-1] + ["baseline"], folder)
    return folder


def sweep_seconds(project: Path, batches: list[int], jobs: int, checks: list) -> float:
    """Queue one experiment per batch size, run the queue with `jobs` workers; seconds until all are done. Each
    sweep trains with its own seed: DVC's run cache would otherwise restore a model an earlier sweep trained."""
    sweep = len(checks) + 1  # the baseline trained with seed 0
    names = {batch: f"batch-{batch}-sweep-{sweep}" for batch in batches}
    for batch, name in names.items():
        queue(project, name, "all", [f"train.batch_size={batch}", f"train.seed={sweep}"])
    start = time.perf_counter()
    dvc(["queue", "start", "-j", str(jobs)], project)
    shown = wait_for(project, list(names.values()))
    seconds = time.perf_counter() - start
    wait_for_workers(project)
    checks.append({"jobs": jobs, "train_runs": linked(project, shown)})
    dvc(["exp", "remove", "--all-commits"], project)
    dvc(["queue", "remove", "--all"], project)
    return seconds


def linked(project: Path, shown: dict[str, dict]) -> dict:
    """Each experiment shown with its metrics, and its own MLflow train run: tagged with its name and with its
    generator's digest; fails naming what is missing. Returns {experiment: train run id}."""
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment_id = client.get_experiment_by_name(load_params(project / "params.yaml").mlflow.experiment).experiment_id
    links = {}
    for name, data in shown.items():
        md5 = data["deps"][str(GENERATOR)]["hash"]
        cached = project / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]
        digest = hashlib.sha256(cached.read_bytes()).hexdigest()
        runs = client.search_runs(
            [experiment_id], f"tags.generator_sha256 = '{digest}' and attributes.run_name = 'train'"
        )
        own = [found for found in runs if found.data.tags.get("dvc_experiment") == name]
        if not data["metrics"] or len(own) != 1:
            raise SystemExit(
                f"{name}: metrics {list(data['metrics'])}; MLflow train runs of its model: "
                + str([found.data.tags.get("dvc_experiment") for found in runs])
            )
        links[name] = own[0].info.run_id
    return links


def plot(figures: dict, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(7, 3.5))
    rows = figures["rounds"]
    for jobs, colour in ((1, "#4c72b0"), (2, "#55a868")):
        times = [r["seconds"] for r in rows if r["config"] == f"-j {jobs}"]
        axis.scatter(times, [f"-j {jobs}"] * len(times), color=colour, s=40)
    ratio = figures["ratio_j2_over_j1"]
    axis.set(
        xlabel="seconds for the whole sweep (each round a dot)",
        title=f"{len(figures['batches'])}-point batch sweep, dvc queue: -j 2 takes x{ratio['median']:.2f} "
        f"[{ratio['min']:.2f}-{ratio['max']:.2f}] of -j 1",
    )
    figure.suptitle(machine_text(), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rounds", type=int, default=3)
    add_report_option(parser, "queue_sweep", "{json,png}")
    args = parser.parse_args()
    checks: list = []
    with tempfile.TemporaryDirectory(prefix="t2v-queue-") as scratch:
        project = tiny_project(Path(scratch) / "project")
        records = measure_rounds(
            {f"-j {jobs}": lambda jobs=jobs: sweep_seconds(project, args.batches, jobs, checks) for jobs in (1, 2)},
            args.rounds,
            label="sweep ",
        )
    by_round: dict[int, dict[str, float]] = {}
    for record in records:
        by_round.setdefault(record["round"], {})[record["config"]] = record["seconds"]
    values = [row["-j 2"] / row["-j 1"] for row in by_round.values()]
    figures = {
        "batches": args.batches,
        "ratio_j2_over_j1": {
            "median": round(statistics.median(values), 3),
            "min": round(min(values), 3),
            "max": round(max(values), 3),
            "goal": 0.65,
        },
        "median_seconds": {
            jobs: round(statistics.median(r["seconds"] for r in records if r["config"] == jobs), 1)
            for jobs in ("-j 1", "-j 2")
        },
        "mlflow_train_runs": checks,
        "rounds": records,
    }
    publish(result_stem(args.report, args.out), figures, plot, ("ratio_j2_over_j1", "median_seconds"))


if __name__ == "__main__":
    main()
