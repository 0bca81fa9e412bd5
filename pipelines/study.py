"""The paper's studies as one command each: every configuration a real `pipelines/train.py` run, all of them child
runs of one MLflow parent run, summarised in reports/study/<study>.md (+ .png, .json).

  --study batch  Table 1: stop epoch and best smoothed PSNR per batch size (constant learning rate)
  --study lr     Fig. 7: learning-rate scaling none / sqrt(k) / k at batch 4 (k = batch / train.base_batch_size)
  --study speed  Fig. 10-13: improvement factor of the input pipeline (preloaded cache), mixed precision and both
                 over the pix2pix default, per batch size, at 1 and 2 workers (train.devices), and the 2-vs-1 speed-up

Each child runs in its own scratch project (its own checkpoints/, models/, metrics/) on one cache made from
./data/ingested by pipelines/preprocess.py with the same overrides, and logs to this project's MLflow store
(MLFLOW_TRACKING_URI, else ./mlflow.db); afterwards it is tagged as a child of the study's parent run. Plain
subprocesses rather than `dvc exp run --queue`: each child is an independent training run that needs no git
commit and never rewrites params.yaml, so a study runs in a working tree that others are editing.

`--preset` and `--set` overrides apply to every child, e.g. the paper's GPU setup: --preset params/paper_gpu.yaml
--values 1 2 4 8 16 32 64 128 256. `--quick` (params/quick_study.yaml) shrinks everything to a few CPU minutes.
Usage: python pipelines/study.py --study {batch,lr,speed} [--quick] [--values ...] [--preset FILE] [--set k=v ...]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from thermal2visible.errors import ConfigError, PipelineError  # noqa: E402
from thermal2visible.config import load_params, preset_overrides  # noqa: E402
from thermal2visible.paths import PIX2PIX_DEFAULT, QUICK_STUDY, STUDY_REPORTS  # noqa: E402
from thermal2visible.study import prepare_cache, train_child  # noqa: E402
from thermal2visible.tracking.store import absolute_tracking_uri  # noqa: E402
from thermal2visible.training.precision import resolve_accelerator, resolve_precision  # noqa: E402

DEFAULT_VALUES = {"batch": ([1, 2, 4, 8, 16, 32, 64], [2, 8, 32]), "lr": ([4], [4]), "speed": ([2, 8, 32], [16])}
LR_RULES = ("none", "sqrt", "linear")
SPEED_CONFIGS = {"default": (), "input": ("loader.preload=true",), "MP": ("train.precision=16-mixed",),
                 "both": ("loader.preload=true", "train.precision=16-mixed")}
SPEED_EPOCHS = ("train.max_epochs=3", "train.min_epochs=3", "early_stop.window=1", "early_stop.patience=100")


def markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]) + "\n"


def dB(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def batch_study(run, values: list[int]) -> tuple[str, plt.Figure]:
    children = [run(f"batch {b}", [f"train.batch_size={b}"]) for b in values]
    table = markdown(["batch", "stop epoch", "best epoch", "best smoothed PSNR (dB)", "PSNR at best (dB)",
                      "time to best (s)", "wall (s)", "images/s"],
                     [[b, c["stopped_epoch"], c["best_epoch"], dB(c["best_psnr_smoothed"]), dB(c["best_psnr"]),
                       c["time_to_best_s"], c["wall_s"], c["images_per_s"]] for b, c in zip(values, children)])
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    labels = [str(b) for b in values]
    left.bar(labels, [c["best_psnr_smoothed"] or 0 for c in children], color="#4c72b0")
    left.set(xlabel="batch size", ylabel="best smoothed PSNR (dB)", title="Quality per batch size (Table 1)")
    right.bar(labels, [c["stopped_epoch"] for c in children], color="#999999", label="stop epoch")
    right.bar(labels, [c["best_epoch"] for c in children], color="#55a868", width=0.5, label="best epoch")
    right.set(xlabel="batch size", ylabel="epoch", title="Where early stopping ended")
    right.legend()
    return table, figure


def lr_study(run, values: list[int]) -> tuple[str, plt.Figure]:
    batch = values[0]
    children = [run(f"lr {rule}", [f"train.batch_size={batch}", f"train.lr_scaling={rule}"]) for rule in LR_RULES]
    table = markdown(["lr scaling", "batch", "stop epoch", "best epoch", "best smoothed PSNR (dB)", "time to best (s)"],
                     [[rule, batch, c["stopped_epoch"], c["best_epoch"], dB(c["best_psnr_smoothed"]),
                       c["time_to_best_s"]] for rule, c in zip(LR_RULES, children)])
    figure, axes = plt.subplots(figsize=(7, 4))
    for rule, child in zip(LR_RULES, children):
        epochs = range(1, len(child["psnr"]) + 1)
        line, = axes.plot(epochs, [float("nan") if v is None else v for v in child["psnr_smoothed"]], linewidth=2,
                          label=f"{rule} (best {dB(child['best_psnr_smoothed'])} dB)")
        axes.plot(epochs, child["psnr"], color=line.get_color(), alpha=0.3, linewidth=1)
    axes.set(xlabel="epoch", ylabel="validation PSNR (dB)", title=f"Learning-rate scaling at batch {batch} (Fig. 7)")
    axes.legend()
    return table, figure


def speed_study(run, values: list[int], workers: list[int]) -> tuple[str, plt.Figure]:
    rate = {}
    for count in workers:
        for batch in values:
            for config, changes in SPEED_CONFIGS.items():
                shape = [f"train.batch_size={batch}", f"train.devices={count}"]
                child = run(f"speed {config} b{batch} w{count}",
                            [*SPEED_EPOCHS, *preset_overrides(PIX2PIX_DEFAULT), *changes, *shape])
                rate[(count, batch, config)] = child["images_per_s"]
    rows = [{"workers": count, "batch": batch, "config": config, "images_per_s": value,
             "improvement": round(value / rate[(count, batch, "default")], 2)}
            for (count, batch, config), value in rate.items()]
    table = markdown(["workers", "batch", "configuration", "images/s", "improvement factor (Fig. 10)"],
                     [[r["workers"], r["batch"], r["config"], r["images_per_s"], f"x{r['improvement']:.2f}"]
                      for r in rows])
    if len(workers) > 1:
        table += "\n" + markdown(["batch", f"speed-up of 'both', {workers[-1]} vs {workers[0]} workers (Fig. 13)"],
                                 [[b, f"x{rate[(workers[-1], b, 'both')] / rate[(workers[0], b, 'both')]:.2f}"]
                                  for b in values])
    headline = rate[(workers[-1], values[-1], "both")] / rate[(workers[0], values[0], "default")]
    table += (f"\nDefault at batch {values[0]} on {workers[0]} worker(s) -> both optimizations at batch {values[-1]} "
              f"on {workers[-1]} worker(s): x{headline:.2f} images/s (the paper's 7.08x on 2 GPUs).\n"
              f"MP is train.precision 16-mixed, which ran as {resolve_precision('auto', resolve_accelerator('auto'))} "
              "here (on a CPU: bf16 only where it has bf16 instructions).\n")
    figure, axes = plt.subplots(1, len(workers), figsize=(5 * len(workers), 3.6), squeeze=False)
    for axis, count in zip(axes[0], workers):
        for i, config in enumerate(SPEED_CONFIGS):
            axis.bar([j + i * 0.2 for j in range(len(values))],
                     [rate[(count, b, config)] / rate[(count, b, "default")] for b in values], 0.2, label=config)
        axis.set_xticks([j + 0.3 for j in range(len(values))], [str(b) for b in values])
        axis.set(xlabel="batch size", ylabel="improvement factor", title=f"{count} worker(s) (Fig. 10)")
        axis.legend()
    return table, figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", choices=["batch", "lr", "speed"], required=True)
    parser.add_argument("--quick", action="store_true", help="small images and short runs: a few CPU minutes")
    parser.add_argument("--values", type=int, nargs="+", help="batch sizes (lr: the one batch size)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="speed study: train.devices values")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--preset", dest="presets", action="append", default=[], metavar="FILE")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--out", type=Path, default=STUDY_REPORTS)
    args = parser.parse_args()
    overrides = [*(preset_overrides(QUICK_STUDY) if args.quick and args.study != "speed" else ()),
                 *(override for preset in args.presets for override in preset_overrides(preset)), *args.overrides]
    values = args.values or DEFAULT_VALUES[args.study][args.quick]
    params = load_params(args.params, overrides)  # a bad override fails here, before any child starts
    mlflow.set_tracking_uri(absolute_tracking_uri())
    mlflow.set_experiment(params.mlflow.experiment)
    with tempfile.TemporaryDirectory(prefix=f"t2v-study-{args.study}-") as work, \
            mlflow.start_run(run_name=f"study-{args.study}") as parent:
        mlflow.log_params({"study": args.study, "values": values, "quick": args.quick, "overrides": overrides})
        cache = prepare_cache(Path(work), args.params, overrides)
        client = MlflowClient()
        children = []

        def run(name: str, changes: list[str]) -> dict:
            print(f"study {args.study}: {name} ...", flush=True)
            child = train_child(Path(work), name, cache, args.params, [*overrides, *changes])
            client.set_tag(child["mlflow_run_id"], "mlflow.parentRunId", parent.info.run_id)
            client.set_tag(child["mlflow_run_id"], "mlflow.runName", f"{args.study}: {name}")
            metric = name.replace(" ", "_")
            mlflow.log_metrics({f"{metric}.images_per_s": child["images_per_s"]}
                               | ({f"{metric}.best_psnr_smoothed": child["best_psnr_smoothed"]}
                                  if child["best_psnr_smoothed"] is not None else {}))
            print(f"  best smoothed PSNR {dB(child['best_psnr_smoothed'])} dB at epoch {child['best_epoch']}, "
                  f"stopped at {child['stopped_epoch']}, {child['images_per_s']} images/s, {child['wall_s']} s",
                  flush=True)
            children.append(child)
            return child

        if args.study == "batch":
            table, figure = batch_study(run, values)
        elif args.study == "lr":
            table, figure = lr_study(run, values)
        else:
            table, figure = speed_study(run, values, args.workers)
        args.out.mkdir(parents=True, exist_ok=True)
        report = args.out / f"{args.study}.md"
        report.write_text(f"# Study: {args.study}\n\nOverrides: `{' '.join(overrides) or 'none'}`; MLflow parent run "
                          f"`{parent.info.run_id}`.\n\n{table}")
        figure.tight_layout()
        figure.savefig(args.out / f"{args.study}.png", dpi=110)
        (args.out / f"{args.study}.json").write_text(json.dumps(children, indent=1) + "\n")
        for path in (report, args.out / f"{args.study}.png", args.out / f"{args.study}.json"):
            mlflow.log_artifact(str(path))
    print(table)
    print(f"wrote {report} and {args.out / (args.study + '.png')}")


if __name__ == "__main__":
    try:
        main()
    except (ConfigError, PipelineError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
