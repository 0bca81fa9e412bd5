"""The paper's studies as one command each, every configuration a real training run and all of them child runs of
one MLflow parent run, summarised in a new reports/study/<date>-<study>.md (+ .png, .json; -2, -3, ... when the
day's name is taken), so a study never writes over an earlier one; `--out DIR` writes DIR/<study>.md (+ .png, .json)
instead, replacing what is there.

  --study batch  Table 1: stop epoch and best smoothed PSNR per batch size (constant learning rate)
  --study lr     Fig. 7: learning-rate scaling none / sqrt(k) / k at batch 4 (k = batch / train.base_batch_size)
  --study speed  Fig. 10-13: improvement factor of the input pipeline (preloaded cache), mixed precision and both
                 over the pix2pix default, per batch size, at 1 and 2 workers (train.devices), and the 2-vs-1 speed-up
  --study quality  pix2pixHD's multi-scale discriminator and feature matching, and the ResNet generator, each added
                 to the default and then the best combination, every one trained for the same wall-clock budget
                 (train.max_minutes) per seed and scored by the evaluate stage: test PSNR, SSIM, identity, images/s,
                 and a grid of the same test faces from each configuration

The batch and lr studies are sweeps of params.yaml: each configuration is a DVC experiment of the train stage
(`dvc exp run train --queue -S ...`), run by `dvc queue start -j JOBS` in DVC's own copy of the project and listed
in `dvc exp show`; the study reads each one's metrics/train.json and its MLflow train run. They need a git clone of
the project. The speed and quality studies time their runs, so they run one at a time in scratch projects on one
cache made from ./data/ingested by pipelines/preprocess.py (--params FILE as the base there), outside DVC.

`--preset` and `--set` overrides apply to every configuration, e.g. the paper's GPU setup: --preset
params/paper_gpu.yaml --values 1 2 4 8 16 32 64 128 256. `--quick` (params/quick_study.yaml) shrinks everything to a
few CPU minutes.
Usage: python pipelines/study.py --study {batch,lr,speed,quality} [--quick] [--values ...] [--jobs N] [--seeds ...]
       [--minutes M] [--preset FILE] [--set k=v ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from thermal2visible.cli import run_stage
from thermal2visible.errors import ConfigError
from thermal2visible.config.load import load_params, preset_overrides
from thermal2visible.config.schema import Params
from studies.results import new_dated_stem
from thermal2visible.paths import PARAMS, QUICK_STUDY, STUDY_REPORTS, TRAIN_METRICS
from studies.queue import queue, require_repository, run_queue
from studies.reports import batch_study, dB, experiments_line, lr_study, quality_study, speed_study
from studies.runs import trained_run
from studies.scratch import evaluate_child, prepare_cache, train_child
from thermal2visible.tracking.store import tracking_uri

QUEUED_STUDIES = ("batch", "lr")  # sweeps of params.yaml; the others time their runs one at a time
DEFAULT_VALUES = {"batch": ([1, 2, 4, 8, 16, 32, 64], [2, 8, 32]), "lr": ([4], [4]), "speed": ([2, 8, 32], [16])}


def report_stem(study: str, out: Path | None) -> Path:
    """Where a study's files go, without suffix and figure name: DIR/<study> for `--out DIR` (the user's choice,
    replaced), else a new reports/study/<today>-<study>[-N] whose files do not exist yet."""
    if out is not None:
        return out / study
    return new_dated_stem(STUDY_REPORTS, study, (".md", ".json", ".png", "_grid.png"))


def study_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--study", choices=["batch", "lr", "speed", "quality"], required=True)
    parser.add_argument("--quick", action="store_true", help="small images and short runs: a few CPU minutes")
    parser.add_argument("--values", type=int, nargs="+", help="batch sizes (lr: the one batch size)")
    parser.add_argument("--jobs", type=int, default=1, help="batch and lr studies: dvc queue start -j JOBS")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="speed study: train.devices values")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], help="quality study: train.seed values")
    parser.add_argument("--minutes", type=float, default=2.0, help="quality study: training budget of every run")
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help=f"write DIR/<study>.md (+ .png, .json), replacing them (default: new dated files in {STUDY_REPORTS})",
    )


def main(params: Params, args: argparse.Namespace) -> None:
    """`params` with the presets and --set overrides (checked before anything starts); --quick goes under them."""
    args.params = Path(args.params)
    overrides = [*(preset_overrides(QUICK_STUDY) if args.quick and args.study != "speed" else ()), *args.settings]
    values = args.values or DEFAULT_VALUES[args.study][args.quick] if args.study != "quality" else args.seeds
    params = load_params(args.params, overrides)
    queued = args.study in QUEUED_STUDIES
    if queued:
        if args.params.resolve() != PARAMS.resolve():
            raise ConfigError(f"--params {args.params}: the {args.study} study queues experiments of {PARAMS}")
        require_repository(Path.cwd())
    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(params.mlflow.experiment)
    with (
        tempfile.TemporaryDirectory(prefix=f"t2v-study-{args.study}-") as work,
        mlflow.start_run(run_name=f"study-{args.study}") as parent,
    ):
        mlflow.log_params({"study": args.study, "values": values, "quick": args.quick, "overrides": overrides})
        cache = None if queued else prepare_cache(Path(work), args.params, overrides)
        client = MlflowClient()
        children = []

        def adopt(child: dict) -> dict:
            """A finished configuration: a child of the study's parent run (unless an earlier study's already, when
            DVC's run cache gave this one that study's model), its figures logged on the parent."""
            name = child["name"]
            if MLFLOW_PARENT_RUN_ID not in client.get_run(child["mlflow_run_id"]).data.tags:
                client.set_tag(child["mlflow_run_id"], MLFLOW_PARENT_RUN_ID, parent.info.run_id)
                client.set_tag(child["mlflow_run_id"], "study_point", f"{args.study}: {name}")
            metric = name.replace(" ", "_")
            mlflow.log_metrics(
                {f"{metric}.images_per_s": child["images_per_s"]}
                | (
                    {f"{metric}.best_psnr_smoothed": child["best_psnr_smoothed"]}
                    if child["best_psnr_smoothed"] is not None
                    else {}
                )
            )
            print(
                f"  {name}: best smoothed PSNR {dB(child['best_psnr_smoothed'])} dB at epoch {child['best_epoch']}, "
                f"stopped at {child['stopped_epoch']}, {child['images_per_s']} images/s, {child['wall_s']} s"
                + (f"; test PSNR {dB(child['eval']['generator']['psnr'])} dB" if "eval" in child else ""),
                flush=True,
            )
            children.append(child)
            return child

        def run(name: str, changes: list[str]) -> dict:
            print(f"study {args.study}: {name} ...", flush=True)
            child = train_child(Path(work), name, cache, args.params, [*overrides, *changes])
            if args.study == "quality":
                child["eval"] = evaluate_child(Path(work), name, args.params, [*overrides, *changes])
            return adopt(child)

        def run_queued(points: dict[str, list[str]]) -> list[dict]:
            settings = {name: [*overrides, *changes] for name, changes in points.items()}
            for name in points:  # every point checked before any is queued
                load_params(PARAMS, settings[name])
            experiments = {name: f"{args.study}-{name.split()[-1]}-{parent.info.run_id[:8]}" for name in points}
            for name, experiment in experiments.items():
                queue(Path.cwd(), experiment, "train", settings[name])
            print(
                f"study {args.study}: {len(points)} experiments queued, dvc queue start -j {args.jobs} ...", flush=True
            )
            shown = run_queue(Path.cwd(), list(experiments.values()), args.jobs)
            return [
                adopt(
                    trained_run(
                        shown[experiment]["metrics"][str(TRAIN_METRICS)]["data"],
                        name,
                        settings[name],
                        {"dvc_experiment": experiment},
                        experiment,
                    )
                )
                for name, experiment in experiments.items()
            ]

        if args.study == "batch":
            table, figures = batch_study(run_queued, values)
        elif args.study == "lr":
            table, figures = lr_study(run_queued, values)
        elif args.study == "speed":
            table, figures = speed_study(run, values, args.workers)
        else:
            table, figures = quality_study(run, args.seeds, args.minutes, cache, Path(work))
        stem = report_stem(args.study, args.out)
        stem.parent.mkdir(parents=True, exist_ok=True)
        report = Path(f"{stem}.md")
        report.write_text(
            f"# Study: {args.study}\n\nOverrides: `{' '.join(overrides) or 'none'}`; MLflow parent run "
            f"`{parent.info.run_id}`.\n\n{experiments_line(children)}{table}"
        )
        # a figure named after the study takes the report's name; quality_grid: <stem>_grid.png
        pictures = [Path(f"{stem}{name.removeprefix(args.study)}.png") for name in figures]
        for figure, path in zip(figures.values(), pictures):
            figure.tight_layout()
            figure.savefig(path, dpi=110)
        Path(f"{stem}.json").write_text(json.dumps(children, indent=1) + "\n")
        for path in (report, *pictures, Path(f"{stem}.json")):
            mlflow.log_artifact(str(path))
    print(table)
    print(f"wrote {report} and {', '.join(map(str, pictures))}")


if __name__ == "__main__":
    run_stage(main, __doc__.splitlines()[0], study_arguments)
