"""Quality across seeds: the demo configuration (params.yaml) trained with several values of train.seed (each seed
draws its own initial weights, jitter crops and dropout masks), and for each --variant the same with that variant's
changes; per run the best smoothed validation PSNR its early stopping kept (what setups are compared by), its best
and stopping epochs and its wall time and seconds per epoch; per setup the mean and the spread (max - min) of each.
With --test, each run is also scored on the test split by the evaluate stage (PSNR, SSIM, identity rank-1): only
for the setup already chosen, whose figure is to be reported, so that no choice is made on the test faces.

All are real `pipelines/train.py` and `pipelines/evaluate.py` runs on the demo data (this project's data/ingested,
preprocessed once by pipelines/preprocess.py), each in a scratch project (pipelines.studies.scratch), logged to
the project's MLflow store under one parent run. Seeds are rounds: each trains every setup, in rotated order, so
drift of the machine hits every setup alike. Quality does not depend on the machine's load, the wall times do.

Writes a new benchmarks/results/<date>-seed_spread.json, .md and .png (--report names them otherwise, --out puts them
at a path of your choice).
Usage: python -m benchmarks.seed_spread [--seeds 5] [--first-seed 0] [--params params.yaml]
       [--variant "train.ema_half_life_images=512" ...] [--test] [--report seed_spread] [--out PATH]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import mlflow  # noqa: E402

from benchmarks.common import (  # noqa: E402
    add_report_option,
    machine_text,
    markdown_table,
    result_file,
    result_stem,
    write_report,
)
from benchmarks.rounds import rotated  # noqa: E402

from thermal2visible.config.load import load_params  # noqa: E402
from thermal2visible.paths import PARAMS  # noqa: E402
from pipelines.studies.scratch import evaluate_child, prepare_cache, train_child  # noqa: E402
from thermal2visible.tracking.store import tracking_uri  # noqa: E402

SCORES = {
    "val_psnr": "val PSNR (dB)",
    "test_psnr": "test PSNR (dB)",
    "test_ssim": "SSIM",
    "identity": "identity rank-1",
    "wall_s": "wall s",
    "epoch_s": "s per epoch",
}


def seconds_per_epoch(child: dict) -> float | None:
    """Seconds per epoch after the first (which carries the start-up), from the times the epochs were logged at."""
    times = child["psnr_seconds"]
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


def scored_run(work: Path, name: str, cache: Path, params: Path, overrides: list[str], test: bool) -> dict:
    """One training in a scratch project (and, with `test`, its evaluation on the test split): what it reports."""
    child = train_child(work, name, cache, params, overrides)
    run = child | {"val_psnr": child["best_psnr_smoothed"], "epoch_s": seconds_per_epoch(child)}
    if not test:
        return run
    scores = evaluate_child(work, name, params, overrides)
    return run | {
        "test_psnr": scores["generator"]["psnr"],
        "test_ssim": scores["generator"]["ssim"],
        "identity": scores["identity"].get("generator"),
    }


def spread(runs: list[dict]) -> dict:
    """Per score: mean, min, max and spread (max - min) over the runs that have it."""
    figures = {}
    for score in SCORES:
        values = [run[score] for run in runs if run.get(score) is not None]
        if values:
            figures[score] = {
                "mean": statistics.mean(values),
                "min": min(values),
                "max": max(values),
                "spread": max(values) - min(values),
            }
    return figures


def table(runs: dict[str, list[dict]], summary: dict[str, dict]) -> str:
    header = ["setup", "seed", *SCORES.values(), "best epoch", "stop epoch"]
    rows = []
    for setup, setup_runs in runs.items():
        for run in setup_runs:
            values = [run.get(score) for score in SCORES]
            rows.append([setup, run["seed"], *(round(v, 3) if v is not None else "-" for v in values)])
            rows[-1] += [run["best_epoch"], run["stopped_epoch"]]
        rows.append(
            [f"**{setup}**", "mean [min-max]"]
            + [
                f"{f['mean']:.3f} [{f['min']:.3f}-{f['max']:.3f}]" if (f := summary[setup].get(score)) else "-"
                for score in SCORES
            ]
            + ["", ""]
        )
    return markdown_table(header, rows)


def plot(runs: dict[str, list[dict]], summary: dict[str, dict], path: Path) -> None:
    """Validation PSNR of every seed (dots) and the setup's mean (bar), per setup."""
    figure, axis = plt.subplots(figsize=(max(5.0, 2.2 + 1.6 * len(runs)), 4))  # the title fits one setup
    for x, (setup, setup_runs) in enumerate(runs.items()):
        axis.bar(x, summary[setup]["val_psnr"]["mean"], color="#4c72b0", alpha=0.35, width=0.6)
        axis.scatter([x] * len(setup_runs), [run["val_psnr"] for run in setup_runs], color="#4c72b0", zorder=3)
    low = min(run["val_psnr"] for setup_runs in runs.values() for run in setup_runs)
    axis.set_xticks(range(len(runs)), list(runs), rotation=15, ha="right", fontsize=8)
    axis.set(ylim=(low - 1, None), ylabel="validation PSNR (dB)", title="Validation PSNR per seed (dots), mean (bar)")
    figure.suptitle(machine_text(), fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def report(stem: Path, setups: dict[str, list[str]], runs: dict[str, list[dict]]) -> str:
    """The .json, .md and .png of the runs so far (setups with none yet are left out); returns their table."""
    done = {setup: setup_runs for setup, setup_runs in runs.items() if setup_runs}
    summary = {setup: spread(setup_runs) for setup, setup_runs in done.items()}
    write_report(stem, {"setups": setups, "summary": summary, "runs": done})
    text = table(done, summary)
    result_file(stem, ".md").write_text(f"# Quality across seeds, {machine_text()}\n\n{text}")
    plot(done, summary, result_file(stem, ".png"))
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="train.seed FIRST .. FIRST+N-1, each a round")
    parser.add_argument("--first-seed", type=int, default=0, help="the first train.seed (default 0)")
    parser.add_argument("--params", type=Path, default=PARAMS)
    parser.add_argument(
        "--variant",
        dest="variants",
        action="append",
        default=[],
        metavar='"SECTION.KEY=VALUE ..."',
        help="adds a setup (repeatable): the --params file with these space-separated changes",
    )
    parser.add_argument("--test", action="store_true", help="also score every run on the test split (the final figure)")
    add_report_option(parser, "seed_spread", "{json,md,png}")
    args = parser.parse_args()
    base = args.params.name  # the setup is named after its params file: params.yaml unless --params gives another
    setups = {base: ["train.image_log_every=0"]}
    setups |= {variant: [*setups[base], *variant.split()] for variant in args.variants}
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(f"{machine_text()}; seeds {seeds[0]}-{seeds[-1]}; setups: {', '.join(setups)}", flush=True)
    mlflow.set_tracking_uri(tracking_uri())
    mlflow.set_experiment(load_params(args.params).mlflow.experiment)
    runs: dict[str, list[dict]] = {setup: [] for setup in setups}
    stem = result_stem(args.report, args.out)
    with tempfile.TemporaryDirectory(prefix="t2v-seeds-") as work, mlflow.start_run(run_name="seed-spread") as parent:
        mlflow.log_params({"seeds": args.seeds, "first_seed": args.first_seed, "variants": args.variants})
        cache = prepare_cache(Path(work), args.params, [])
        for seed in seeds:
            for setup in rotated(list(setups), seed):
                name = f"{setup} seed {seed}"
                overrides = [*setups[setup], f"train.seed={seed}"]
                run = scored_run(Path(work), name, cache, args.params, overrides, args.test)
                mlflow.MlflowClient().set_tag(run["mlflow_run_id"], "mlflow.parentRunId", parent.info.run_id)
                runs[setup].append(run | {"seed": seed})
                tested = f", test {run['test_psnr']:.2f} dB, identity {run['identity']}" if args.test else ""
                print(
                    f"  {name}: validation {run['val_psnr']:.2f} dB{tested}, best epoch {run['best_epoch']}, "
                    f"stopped {run['stopped_epoch']}, {run['wall_s']} s",
                    flush=True,
                )
                # A run takes minutes: the report holds every finished one, so a stopped benchmark keeps them.
                text = report(stem, setups, runs)
    print(text)
    print(f"wrote {stem}.json, .md and .png")


if __name__ == "__main__":
    main()
