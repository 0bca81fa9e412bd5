"""Time to quality, the analogue of the paper's 7.08x: wall-clock seconds until a run's smoothed validation PSNR
reaches the best the pix2pix default setup (batch 1, fp32, NCHW, plain Adam, memory-mapped input:
params/pix2pix_default.yaml) reaches, for that setup and for this project's default (params.yaml: batch 8, precision
auto, fused Adam, preloaded cache) and, for each --variant, the project default with that variant's changes; and the
best smoothed validation PSNR each keeps. With --budgets, the quality at equal wall time as well: in each round the
pix2pix default trains again for each budget, a multiple of the project default's wall time in that round
(train.max_minutes, no early stop and no epoch cap: time alone ends it), and its validation PSNR stands beside the
project default's. Setups are compared on validation only; --test also scores every run on the test split
(`pipelines/evaluate.py`), for a final figure of setups already chosen.

All are real `pipelines/train.py` runs on the demo data (this project's data/ingested, preprocessed by
pipelines/preprocess.py), each in a scratch project. All stop by the
same PSNR rule, params.yaml's early_stop (scaled down from the paper's 50/50) unless --window/--patience set
another, and params.yaml's cap on epochs unless --max-epochs sets another: both stated in the report.
--baseline-max-epochs caps the pix2pix default's own run (the one its best, the target, comes from) lower, where only
the equal budgets are wanted: at batch 1 it is the longest run of a round.
The runs are interleaved (benchmarks/rounds.py): each round trains every setup with that round's seed, in rotated
order; the time to the target counts from the run's start to the MLflow timestamp of the first epoch whose smoothed
PSNR reaches the pix2pix default's best in the same round. The child-run machinery is pipelines.studies.scratch.

Writes a new benchmarks/results/<date>-time_to_quality.json and .png (--report names them otherwise, --out puts
them at a path of your choice).
Usage: python -m benchmarks.time_to_quality [--rounds 2] [--window W] [--patience P] [--max-epochs E]
       [--baseline-max-epochs E] [--variant "train.batch_size=4 train.lr_scaling=sqrt" ...] [--budgets 1 3]
       [--test] [--report time_to_quality] [--out PATH]
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
import mlflow  # noqa: E402

from benchmarks.common import (  # noqa: E402
    add_report_option,
    machine_text,
    markdown_table,
    result_file,
    result_stem,
    write_report,
)
from benchmarks.rounds import measure_rounds, plot_speedups, ratio_text, summarize  # noqa: E402

from thermal2visible.config.load import load_params, preset_overrides  # noqa: E402
from thermal2visible.paths import PARAMS, PIX2PIX_DEFAULT  # noqa: E402
from pipelines.studies.scratch import evaluate_child, prepare_cache, train_child  # noqa: E402
from thermal2visible.tracking.store import tracking_uri  # noqa: E402

PAPER, PROJECT = "pix2pix default (batch 1, fp32)", "project default (params.yaml)"
VARIANT_COLOURS = ["#dd8452", "#4c72b0", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]


def trained(work: Path, name: str, cache: Path, params: Path, overrides: list[str], test: bool) -> dict:
    """A training in a scratch project, its kept validation PSNR as `val_psnr` (and with `test`, `test_psnr`)."""
    child = train_child(work, name, cache, params, overrides)
    child["val_psnr"] = child["best_psnr_smoothed"]
    if test:
        child["test_psnr"] = evaluate_child(work, name, params, overrides)["generator"]["psnr"]
    return child


def seconds_to(child: dict, target: float) -> float:
    """When the smoothed PSNR first reached `target`; inf if it never did."""
    reached = (
        s for s, value in zip(child["psnr_seconds"], child["psnr_smoothed"]) if value is not None and value >= target
    )
    return next(reached, math.inf)


def time_to_targets(children: dict[tuple[str, int], dict]) -> None:
    """Sets each run's target, the pix2pix default's best smoothed PSNR in the same round, exactly as its curve holds
    it (rounding it could put it above the curve's own best, which the baseline then never reaches), and the seconds
    the run took to reach it."""
    for (_, seed), child in children.items():
        child["target_psnr"] = children[PAPER, seed]["best_psnr_smoothed"]
        child["seconds_to_target"] = seconds_to(child, child["target_psnr"])


def budget_overrides(project_wall_s: float, factor: float) -> list[str]:
    """A run that time alone ends: `factor` times the project default's wall time, no early stop, no epoch cap."""
    unbounded = 10**6
    return [
        f"train.max_minutes={factor * project_wall_s / 60:.4f}",
        f"train.max_epochs={unbounded}",
        f"early_stop.patience={unbounded}",
    ]


def at_equal_budgets(runs: list[dict]) -> dict[str, dict]:
    """Per budget, the pix2pix default's validation PSNR against the project default's (same round), each round's
    difference, and their median and range."""
    summary: dict[str, dict] = {}
    for factor in dict.fromkeys(run["budget_factor"] for run in runs):
        rounds = [run for run in runs if run["budget_factor"] == factor]
        gains = sorted(run["project_val_psnr"] - run["pix2pix_val_psnr"] for run in rounds)
        summary[f"{factor:g}x"] = {
            "rounds": len(rounds),
            "pix2pix_val_psnr": [run["pix2pix_val_psnr"] for run in rounds],
            "project_val_psnr": [run["project_val_psnr"] for run in rounds],
            "project_gain_db_median": statistics.median(gains),
            "project_gain_db_min": gains[0],
            "project_gain_db_max": gains[-1],
        }
    return summary


def plot(children: dict, summary: dict, path: Path, machine_line: str) -> None:
    """Colour: the setup; line style: the seed (kept PSNRs are in the printed table and the JSON)."""
    names = list(dict.fromkeys(name for name, _ in children))
    seeds = sorted({seed for _, seed in children})
    variants = [name for name in names if name not in (PAPER, PROJECT)]
    colours = {PAPER: "#999999", PROJECT: "#55a868"} | dict(zip(variants, itertools.cycle(VARIANT_COLOURS)))
    styles = {seed: ["-", "--", ":", "-."][seed % 4] for seed in seeds}
    legend_rows = math.ceil((len(names) + len(seeds)) / 3)
    figure, (curves, ratio) = plt.subplots(
        1, 2, figsize=(15, 4.6 + 0.2 * legend_rows), gridspec_kw={"width_ratios": [1.3, 1]}
    )
    for (name, seed), child in children.items():
        curves.plot(
            child["psnr_seconds"],
            [math.nan if v is None else v for v in child["psnr_smoothed"]],
            color=colours[name],
            linewidth=2,
            linestyle=styles[seed],
        )
    curves.set(
        xlabel="seconds since the run started",
        ylabel="smoothed validation PSNR (dB)",
        title="Smoothed validation PSNR over wall-clock time",
    )
    handles = [Line2D([], [], color=colours[name], linewidth=2, label=name) for name in names]
    handles += [Line2D([], [], color="black", linestyle=styles[seed], label=f"seed {seed}") for seed in seeds]
    figure.legend(handles=handles, loc="lower left", ncol=3, fontsize=8, frameon=False)
    plot_speedups(ratio, summary, "Time to the pix2pix default's best", colours)
    figure.suptitle(machine_line, fontsize=9)
    figure.tight_layout(rect=(0, 0.04 * legend_rows, 1, 1))
    figure.savefig(path, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the stop rule and the epoch cap params.yaml's where the options leave them out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="seeds; each trains every setup")
    parser.add_argument("--window", type=int, help="early-stop window (default: params.yaml's)")
    parser.add_argument("--patience", type=int, help="early-stop patience (default: params.yaml's)")
    parser.add_argument("--max-epochs", type=int, help="epoch cap (default: params.yaml's train.max_epochs)")
    parser.add_argument(
        "--baseline-max-epochs", type=int, help="epoch cap of the pix2pix default's own run (default: --max-epochs)"
    )
    parser.add_argument("--params", type=Path, default=PARAMS)
    parser.add_argument(
        "--budgets",
        type=float,
        nargs="*",
        default=[],
        metavar="FACTOR",
        help="also train the pix2pix default for FACTOR times the project default's wall time, per round (e.g. 1 3)",
    )
    parser.add_argument(
        "--variant",
        dest="variants",
        action="append",
        default=[],
        metavar='"SECTION.KEY=VALUE ..."',
        help="adds a setup (repeatable): the project default with these space-separated changes (its own levers: "
        "train.batch_size, train.lr_scaling, ...)",
    )
    parser.add_argument("--test", action="store_true", help="also score every run on the test split (the final figure)")
    add_report_option(parser, "time_to_quality", "{json,png}")
    args = parser.parse_args(argv)
    params = load_params(args.params)
    early_stop = params.early_stop
    if args.max_epochs is None:
        args.max_epochs = params.train.max_epochs
    if args.baseline_max_epochs is None:
        args.baseline_max_epochs = args.max_epochs
    if args.window is None:
        args.window = early_stop.window
    if args.patience is None:
        args.patience = early_stop.patience
    return args


def main() -> None:
    args = parse_args()
    common = [f"early_stop.window={args.window}", f"early_stop.patience={args.patience}", "train.image_log_every=0"]
    project = [*common, f"train.max_epochs={args.max_epochs}"]
    setups = {
        PAPER: [*common, *preset_overrides(PIX2PIX_DEFAULT), f"train.max_epochs={args.baseline_max_epochs}"],
        PROJECT: project,
    }
    for variant in args.variants:
        setups[f"project default, {variant}"] = [*project, *variant.split()]
    children: dict[tuple[str, int], dict] = {}
    print(
        f"{machine_text()}; {args.rounds} rounds (seeds), window {args.window}, patience {args.patience}, "
        f"at most {args.max_epochs} epochs ({args.baseline_max_epochs} for the pix2pix default's own run)",
        flush=True,
    )
    # The parent run is made here, in the project, so the experiment (and its artifact folder) is the project's,
    # not a scratch child's.
    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(load_params(args.params).mlflow.experiment)
    with tempfile.TemporaryDirectory(prefix="t2v-ttq-") as work, mlflow.start_run(run_name="time-to-quality") as parent:
        mlflow.log_params(
            {
                "window": args.window,
                "patience": args.patience,
                "max_epochs": args.max_epochs,
                "baseline_max_epochs": args.baseline_max_epochs,
                "rounds": args.rounds,
                "variants": args.variants,
            }
        )
        cache = prepare_cache(Path(work), args.params, [])

        def run(name: str):
            def train() -> float:
                seed = sum(1 for key in children if key[0] == name)
                overrides = [*setups[name], f"train.seed={seed}"]
                child = trained(Path(work), f"{name} seed {seed}", cache, args.params, overrides, args.test)
                children[name, seed] = child
                mlflow.MlflowClient().set_tag(child["mlflow_run_id"], "mlflow.parentRunId", parent.info.run_id)
                print(
                    f"    {name}, seed {seed}: best smoothed {child['best_psnr_smoothed']:.2f} dB at epoch "
                    f"{child['best_epoch']} ({child['time_to_best_s']} s), stopped at epoch "
                    f"{child['stopped_epoch']}, {child['wall_s']} s"
                    + (f", test {child['test_psnr']:.2f} dB" if args.test else ""),
                    flush=True,
                )
                return child["wall_s"]

            return train

        records = measure_rounds({name: run(name) for name in setups}, args.rounds, warmup_rounds=0)
        budget_runs = []
        for (name, seed), project in list(children.items()):
            for factor in args.budgets if name == PROJECT else []:
                budgeted = trained(
                    Path(work),
                    f"{PAPER} for {factor:g}x seed {seed}",
                    cache,
                    args.params,
                    [*setups[PAPER], f"train.seed={seed}", *budget_overrides(project["wall_s"], factor)],
                    args.test,
                )
                mlflow.MlflowClient().set_tag(budgeted["mlflow_run_id"], "mlflow.parentRunId", parent.info.run_id)
                budget_runs.append(
                    {
                        "seed": seed,
                        "budget_factor": factor,
                        "budget_s": round(factor * project["wall_s"], 1),
                        "pix2pix_val_psnr": budgeted["val_psnr"],
                        "pix2pix_wall_s": budgeted["wall_s"],
                        "pix2pix_stopped_epoch": budgeted["stopped_epoch"],
                        "project_val_psnr": project["val_psnr"],
                    }
                )
                print(
                    f"    {PAPER} for {factor:g}x the project default's {project['wall_s']} s, seed {seed}: "
                    f"validation {budgeted['val_psnr']:.2f} dB after {budgeted['stopped_epoch']} epochs; the project "
                    f"default: {project['val_psnr']:.2f} dB",
                    flush=True,
                )
    # The figure compared is the time to the pix2pix default's best in the same round, not the wall time.
    time_to_targets(children)
    for record in records:
        child = children[record["config"], record["round"]]
        record |= {
            "wall_s": record["seconds"],
            "target_psnr": child["target_psnr"],
            "seconds": child["seconds_to_target"],
        }
    summary = summarize(records, baseline=PAPER)
    rows = [
        [
            name,
            seed,
            round(c["best_psnr_smoothed"], 2),
            c["best_epoch"],
            c["stopped_epoch"],
            c["seconds_to_target"],
            c["wall_s"],
            c["images_per_s"],
            round(c["test_psnr"], 2) if "test_psnr" in c else "-",
        ]
        for (name, seed), c in sorted(children.items(), key=lambda item: item[0][1])
    ]
    print(
        markdown_table(
            [
                "setup",
                "seed",
                "best smoothed PSNR (dB)",
                "best epoch",
                "stop epoch",
                "s to the default's best",
                "wall s",
                "images/s",
                "test PSNR (dB)",
            ],
            rows,
        )
    )
    for name in list(setups)[1:]:
        print(
            f"{name}: speed-up to the pix2pix default's best smoothed PSNR {ratio_text(summary['configs'][name])} "
            f"({summary['rounds_counted']} rounds); {machine_text()}"
        )
    equal_budgets = at_equal_budgets(budget_runs)
    for budget, figures in equal_budgets.items():
        print(
            f"at {budget} the project default's wall time: the project default's validation PSNR is "
            f"{figures['project_gain_db_median']:+.2f} dB [{figures['project_gain_db_min']:+.2f} to "
            f"{figures['project_gain_db_max']:+.2f}] from the pix2pix default's ({figures['rounds']} rounds)"
        )
    stem = result_stem(args.report, args.out)
    write_report(
        stem,
        {
            "summary": summary,
            "records": records,
            "window": args.window,
            "patience": args.patience,
            "max_epochs": args.max_epochs,
            "baseline_max_epochs": args.baseline_max_epochs,
            "setups": setups,
            "runs": [c | {"setup": n, "seed": s} for (n, s), c in children.items()],
            "equal_budgets": {"runs": budget_runs, "summary": equal_budgets},
        },
    )
    plot(children, summary, result_file(stem, ".png"), machine_text())
    print(f"wrote {stem}.json and .png")


if __name__ == "__main__":
    main()
