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
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
import torch  # noqa: E402
from mlflow import MlflowClient  # noqa: E402
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID  # noqa: E402

from thermal2visible.cli import run_stage  # noqa: E402
from thermal2visible.errors import ConfigError  # noqa: E402
from thermal2visible.config.load import load_params, preset_overrides  # noqa: E402
from thermal2visible.config.schema import LoaderConfig, Params  # noqa: E402
from thermal2visible.models.payloads import load_generator  # noqa: E402
from thermal2visible.data.datamodule import PairedDataModule, model_batch  # noqa: E402
from thermal2visible.models.generator import as_tested  # noqa: E402
from thermal2visible.dev.results import new_dated_stem  # noqa: E402
from thermal2visible.paths import GENERATOR, PARAMS, PIX2PIX_DEFAULT, QUICK_STUDY, STUDY_REPORTS, TRAIN_METRICS  # noqa: E402
from thermal2visible.studies.queue import queue, require_repository, run_queue  # noqa: E402
from thermal2visible.studies.runs import trained_run  # noqa: E402
from thermal2visible.studies.scratch import child_project, evaluate_child, prepare_cache, train_child  # noqa: E402
from thermal2visible.tracking.figures import image_rows  # noqa: E402
from thermal2visible.tracking.store import tracking_uri  # noqa: E402
from thermal2visible.training.precision import resolve_accelerator, resolve_precision  # noqa: E402

QUEUED_STUDIES = ("batch", "lr")  # sweeps of params.yaml; the others time their runs one at a time
DEFAULT_VALUES = {"batch": ([1, 2, 4, 8, 16, 32, 64], [2, 8, 32]), "lr": ([4], [4]), "speed": ([2, 8, 32], [16])}
LR_RULES = ("none", "sqrt", "linear")
SPEED_CONFIGS = {
    "default": (),
    "input": ("loader.preload=true",),
    "MP": ("train.precision=16-mixed",),
    "both": ("loader.preload=true", "train.precision=16-mixed"),
}
SPEED_EPOCHS = ("train.max_epochs=3", "train.min_epochs=3", "early_stop.window=1", "early_stop.patience=100")
# pix2pixHD's own settings: two discriminator scales (its num_D), feature matching at lambda_feat 10
QUALITY_CHANGES = {
    "multi-scale D": ("model.discriminator_scales=2",),
    "feature matching": ("train.lambda_feat=10",),
    "ResNet generator": ("model.generator=resnet",),
}
GRID_FACES = 8


def report_stem(study: str, out: Path | None) -> Path:
    """Where a study's files go, without suffix and figure name: DIR/<study> for `--out DIR` (the user's choice,
    replaced), else a new reports/study/<today>-<study>[-N] whose files do not exist yet."""
    if out is not None:
        return out / study
    return new_dated_stem(STUDY_REPORTS, study, (".md", ".json", ".png", "_grid.png"))


def markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]) + "\n"


def experiments_line(children: list[dict]) -> str:
    names = [child["dvc_experiment"] for child in children if child["dvc_experiment"]]
    return f"DVC experiments (`dvc exp show`, `dvc exp apply NAME`): {', '.join(names)}.\n\n" if names else ""


def dB(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def batch_study(run_all, values: list[int]) -> tuple[str, plt.Figure]:
    children = run_all({f"batch {b}": [f"train.batch_size={b}"] for b in values})
    table = markdown(
        [
            "batch",
            "stop epoch",
            "best epoch",
            "best smoothed PSNR (dB)",
            "PSNR at best (dB)",
            "time to best (s)",
            "wall (s)",
            "images/s",
        ],
        [
            [
                b,
                c["stopped_epoch"],
                c["best_epoch"],
                dB(c["best_psnr_smoothed"]),
                dB(c["best_psnr"]),
                c["time_to_best_s"],
                c["wall_s"],
                c["images_per_s"],
            ]
            for b, c in zip(values, children)
        ],
    )
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = [str(b) for b in values]
    left.bar(labels, [c["best_psnr_smoothed"] or 0 for c in children], color="#4c72b0")
    left.set(xlabel="batch size", ylabel="best smoothed PSNR (dB)", title="Quality per batch size (Table 1)")
    right.bar(labels, [c["stopped_epoch"] for c in children], color="#999999", label="stop epoch")
    right.bar(labels, [c["best_epoch"] for c in children], color="#55a868", width=0.5, label="best epoch")
    right.set(xlabel="batch size", ylabel="epoch", title="Where early stopping ended")
    right.legend()
    return table, {"batch": figure}


def lr_study(run_all, values: list[int]) -> tuple[str, plt.Figure]:
    batch = values[0]
    children = run_all({f"lr {rule}": [f"train.batch_size={batch}", f"train.lr_scaling={rule}"] for rule in LR_RULES})
    table = markdown(
        ["lr scaling", "batch", "stop epoch", "best epoch", "best smoothed PSNR (dB)", "time to best (s)"],
        [
            [rule, batch, c["stopped_epoch"], c["best_epoch"], dB(c["best_psnr_smoothed"]), c["time_to_best_s"]]
            for rule, c in zip(LR_RULES, children)
        ],
    )
    figure, axes = plt.subplots(figsize=(7, 4))
    for rule, child in zip(LR_RULES, children):
        epochs = range(1, len(child["psnr"]) + 1)
        (line,) = axes.plot(
            epochs,
            [float("nan") if v is None else v for v in child["psnr_smoothed"]],
            linewidth=2,
            label=f"{rule} (best {dB(child['best_psnr_smoothed'])} dB)",
        )
        axes.plot(epochs, child["psnr"], color=line.get_color(), alpha=0.3, linewidth=1)
    axes.set(xlabel="epoch", ylabel="validation PSNR (dB)", title=f"Learning-rate scaling at batch {batch} (Fig. 7)")
    axes.legend()
    return table, {"lr": figure}


def speed_study(run, values: list[int], workers: list[int]) -> tuple[str, plt.Figure]:
    rate = {}
    for count in workers:
        for batch in values:
            for config, changes in SPEED_CONFIGS.items():
                shape = [f"train.batch_size={batch}", f"train.devices={count}"]
                child = run(
                    f"speed {config} b{batch} w{count}",
                    [*SPEED_EPOCHS, *preset_overrides(PIX2PIX_DEFAULT), *changes, *shape],
                )
                rate[(count, batch, config)] = child["images_per_s"]
    rows = [
        {
            "workers": count,
            "batch": batch,
            "config": config,
            "images_per_s": value,
            "improvement": round(value / rate[(count, batch, "default")], 2),
        }
        for (count, batch, config), value in rate.items()
    ]
    table = markdown(
        ["workers", "batch", "configuration", "images/s", "improvement factor (Fig. 10)"],
        [[r["workers"], r["batch"], r["config"], r["images_per_s"], f"x{r['improvement']:.2f}"] for r in rows],
    )
    if len(workers) > 1:
        table += "\n" + markdown(
            ["batch", f"speed-up of 'both', {workers[-1]} vs {workers[0]} workers (Fig. 13)"],
            [[b, f"x{rate[(workers[-1], b, 'both')] / rate[(workers[0], b, 'both')]:.2f}"] for b in values],
        )
    headline = rate[(workers[-1], values[-1], "both")] / rate[(workers[0], values[0], "default")]
    table += (
        f"\nDefault at batch {values[0]} on {workers[0]} worker(s) -> both optimizations at batch {values[-1]} "
        f"on {workers[-1]} worker(s): x{headline:.2f} images/s (the paper's 7.08x on 2 GPUs).\n"
        f"MP is train.precision 16-mixed, which ran as {resolve_precision('auto', resolve_accelerator('auto'))} "
        "here (on a CPU: bf16 only where it has bf16 instructions).\n"
    )
    figure, axes = plt.subplots(1, len(workers), figsize=(5 * len(workers), 3.6), squeeze=False)
    for axis, count in zip(axes[0], workers):
        for i, config in enumerate(SPEED_CONFIGS):
            axis.bar(
                [j + i * 0.2 for j in range(len(values))],
                [rate[(count, b, config)] / rate[(count, b, "default")] for b in values],
                0.2,
                label=config,
            )
        axis.set_xticks([j + 0.3 for j in range(len(values))], [str(b) for b in values])
        axis.set(xlabel="batch size", ylabel="improvement factor", title=f"{count} worker(s) (Fig. 10)")
        axis.legend()
    return table, {"speed": figure}


def quality_study(
    run, seeds: list[int], minutes: float, cache: Path, work: Path, loader: LoaderConfig
) -> tuple[str, dict]:
    """Every configuration trained for `minutes` of wall clock per seed, seeds in turn, the order of the
    configurations rotated from seed to seed (so none always runs on a fresher machine); then the best combination:
    the changes that beat the default's mean test PSNR, or the two best changes when fewer than two did."""
    budget = [f"train.max_minutes={minutes}", "train.max_epochs=100000"]  # the clock ends a run (or early stopping)
    configs = {"default": (), **QUALITY_CHANGES}
    results: dict[str, list[dict]] = {name: [] for name in configs}
    for turn, seed in enumerate(seeds):
        names = list(configs)[turn % len(configs) :] + list(configs)[: turn % len(configs)]
        for name in names:
            results[name].append(run(f"{name} seed {seed}", [*budget, *configs[name], f"train.seed={seed}"]))
    psnr = {name: [child["eval"]["generator"]["psnr"] for child in children] for name, children in results.items()}
    ranked = sorted(QUALITY_CHANGES, key=lambda name: statistics.mean(psnr[name]), reverse=True)
    winners = [name for name in ranked if statistics.mean(psnr[name]) > statistics.mean(psnr["default"])]
    combined = winners if len(winners) >= 2 else ranked[:2]
    configs["best combination"] = tuple(change for name in combined for change in QUALITY_CHANGES[name])
    results["best combination"] = [
        run(f"best combination seed {seed}", [*budget, *configs["best combination"], f"train.seed={seed}"])
        for seed in seeds
    ]
    psnr["best combination"] = [child["eval"]["generator"]["psnr"] for child in results["best combination"]]

    def verdict(name: str) -> str:
        if name == "default":
            return "-"
        wins = sum(mine > theirs for mine, theirs in zip(psnr[name], psnr["default"]))
        losses = sum(mine < theirs for mine, theirs in zip(psnr[name], psnr["default"]))
        if wins == len(seeds) or losses == len(seeds):
            return "better in every seed" if wins else "worse in every seed"
        return f"better in {wins}, worse in {losses} of {len(seeds)} seeds"

    def mean(name: str, score) -> str:
        values = [score(child) for child in results[name]]
        return "-" if None in values else f"{statistics.mean(values):.3f}"

    table = markdown(
        [
            "configuration",
            "changes",
            "test PSNR per seed (dB)",
            "mean PSNR (dB)",
            "mean SSIM",
            "identity (mean)",
            "epochs in the budget",
            "images/s",
            "vs default (PSNR)",
        ],
        [
            [
                name,
                " ".join(configs[name]) or "params.yaml",
                " / ".join(dB(v) for v in psnr[name]),
                dB(statistics.mean(psnr[name])),
                mean(name, lambda c: c["eval"]["generator"]["ssim"]),
                mean(name, lambda c: c["eval"]["identity"].get("generator")),
                " / ".join(str(c["stopped_epoch"]) for c in results[name]),
                f"{statistics.median(c['images_per_s'] for c in results[name]):.1f}",
                verdict(name),
            ]
            for name in configs
        ],
    )
    identity = results["default"][0]["eval"]["identity"]
    table += (
        f"\nSeeds {', '.join(map(str, seeds))}; {minutes} min of training per run (loading, steps and "
        "validation; early stopping may end a run sooner); best combination = "
        f"{' + '.join(combined)}. Identity: {identity.get('score') or 'none'} ({identity['why']}).\n"
    )
    bars, axis = plt.subplots(figsize=(8, 3.8))
    for x, name in enumerate(configs):
        axis.bar(x, statistics.mean(psnr[name]), color="#4c72b0" if name == "default" else "#8da0cb")
        axis.plot([x] * len(psnr[name]), psnr[name], "o", color="black", markersize=4)
    axis.set_xticks(range(len(configs)), [name.replace(" ", "\n", 1) for name in configs])
    low = min(min(values) for values in psnr.values())
    axis.set(
        ylim=(low - 1, None),
        ylabel="test PSNR (dB): mean bar, seeds dots",
        title=f"Quality at equal training time ({minutes} min per run)",
    )
    return table, {"quality": bars, "quality_grid": faces_grid(results, cache, work, loader)}


@torch.inference_mode()
def faces_grid(results: dict[str, list[dict]], cache: Path, work: Path, loader: LoaderConfig) -> plt.Figure:
    """The same first test faces: thermal, each configuration's generator (first seed), real."""
    data = PairedDataModule(cache, GRID_FACES, dataclasses.replace(loader, preload=False))
    data.setup("test")
    batch = model_batch(next(iter(data.test_dataloader())))
    rows, labels = [batch["thermal"]], ["thermal"]
    for name, children in results.items():
        generator, payload = load_generator(child_project(work, children[0]["name"]) / GENERATOR)
        with as_tested(generator, payload["test_mode"]):
            rows.append(generator(batch["thermal"]))
        labels.append(f"{name}\n{dB(children[0]['eval']['generator']['psnr'])} dB")
    rows.append(batch["visible"])
    labels.append("real")
    figure, axes = plt.subplots(len(rows), 1, figsize=(1.1 * len(rows[0]) + 1.6, 1.15 * len(rows)))
    for axis, row, label in zip(axes, rows, labels):
        axis.imshow(image_rows(row))
        axis.set_xticks([])
        axis.set_yticks([])
        axis.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
    figure.suptitle("Same test faces, each configuration's first seed", fontsize=9)
    return figure


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
                        shown[experiment]["metrics"][str(TRAIN_METRICS)]["data"], name, settings[name], experiment
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
            table, figures = quality_study(run, args.seeds, args.minutes, cache, Path(work), params.loader)
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
