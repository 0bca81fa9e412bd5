"""Choose early stopping's patience and min_delta on validation curves already recorded: each run of a seed_spread
result holds the validation PSNR of every epoch up to its cap, and a run that stops earlier trains the same epochs
up to its stop (the stop settings change where a run ends, not what it trains), so every rule can be replayed on
them (training.early_stopping.StopRule, the code the training runs) without training again.

For each (patience, min_delta) of the grid, per run: the epoch it stops at, the best smoothed validation PSNR it
keeps, and what that loses against training to the cap. The chosen rule is the one with the fewest epochs on
average among those that stop before the cap in every run and lose at most --budget dB on average: the cap stays a
safety net, not the setting. No test score is read.

Writes benchmarks/results/<date>-stop_rule.json and .md.
Usage: python -m benchmarks.stop_rule RESULT.json [...] [--budget 0.1] [--report stop_rule] [--out PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

from benchmarks.common import add_report_option, markdown_table, result_file, result_stem, write_report

from thermal2visible.training.early_stopping import PsnrEarlyStopping, StopRule

PATIENCES = range(10, 45, 5)
MIN_DELTAS = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)


def kept(history: list[float], window: int, epochs: int) -> float:
    """The best smoothed validation PSNR of the first `epochs` epochs: what a run stopped there keeps."""
    stopping = PsnrEarlyStopping(window, patience=1)
    for psnr in history[:epochs]:
        stopping.observe(psnr)
    return stopping.best_smoothed


def replayed(runs: list[dict], window: int, cap: int, patience: int, min_delta: float) -> dict:
    rule = StopRule(window, patience, min_delta, 1, cap)
    stops = [rule.first_stop(run["psnr"]) or len(run["psnr"]) for run in runs]
    losses = [kept(run["psnr"], window, cap) - kept(run["psnr"], window, stop) for run, stop in zip(runs, stops)]
    # the share of the run to the cap's time (the epochs' logged times) a stop there takes
    shares = [run["psnr_seconds"][stop - 1] / run["psnr_seconds"][cap - 1] for run, stop in zip(runs, stops)]
    return {
        "patience": patience,
        "min_delta": min_delta,
        "stops": stops,
        "before_cap": sum(stop < cap for stop in stops),
        "mean_epochs": statistics.mean(stops),
        "mean_val_loss_db": statistics.mean(losses),
        "max_val_loss_db": max(losses),
        "mean_time_share": statistics.mean(shares),
    }


def choose(runs: list[dict], window: int, budget: float) -> tuple[int, list[dict], dict | None]:
    """(the cap every run reached, the grid replayed on the runs' validation curves cut there, the chosen rule)."""
    cap = min(len(run["psnr"]) for run in runs)
    curves = [{"psnr": run["psnr"][:cap], "psnr_seconds": run["psnr_seconds"][:cap]} for run in runs]
    grid = [replayed(curves, window, cap, *point) for point in itertools.product(PATIENCES, MIN_DELTAS)]
    eligible = [row for row in grid if row["before_cap"] == len(runs) and row["mean_val_loss_db"] <= budget]
    return cap, grid, min(eligible, key=lambda row: (row["mean_epochs"], row["mean_val_loss_db"]), default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", type=Path, help="seed_spread result files of one setup")
    parser.add_argument("--window", type=int, default=5, help="early_stop.window the runs were trained with")
    parser.add_argument("--budget", type=float, default=0.1, help="mean validation dB a rule may lose to the cap")
    add_report_option(parser, "stop_rule", "json/.md")
    args = parser.parse_args()
    sources = [json.loads(path.read_text()) for path in args.results]
    runs = [run for source in sources for setup in source["runs"].values() for run in setup]
    cap, grid, chosen = choose(runs, args.window, args.budget)
    stem = result_stem(args.report, args.out)
    write_report(
        stem,
        {
            "sources": [str(path) for path in args.results],
            "source_machines": [source.get("machine") for source in sources],
            "runs": [run["name"] for run in runs],
            "window": args.window,
            "cap": cap,
            "budget_db": args.budget,
            "grid": grid,
            "chosen": chosen,
        },
    )
    rows = [
        [row["patience"], row["min_delta"], f"{row['before_cap']}/{len(runs)}", f"{row['mean_epochs']:.1f}"]
        + [f"{row['mean_time_share']:.2f}", f"{row['mean_val_loss_db']:.3f}", f"{row['max_val_loss_db']:.3f}"]
        + [" ".join(map(str, row["stops"]))]
        for row in sorted(grid, key=lambda row: row["mean_epochs"])
        if row["before_cap"] >= len(runs) - 1
    ]
    text = "\n".join(
        [
            f"# Early stopping replayed on {len(runs)} runs' validation curves (window {args.window}, cap {cap})",
            "",
            f"Chosen: {json.dumps(chosen)}"
            if chosen
            else "No rule within the budget stops before the cap in every run.",
            "",
            "Rules that stop before the cap in all runs but one or more, by mean epochs; time share: of the time to "
            "the cap, from the epochs' logged times; loss: best smoothed validation PSNR kept, against training to "
            "the cap.",
            "",
            markdown_table(
                ["patience", "min_delta", "before cap", "mean epochs", "time share", "mean loss dB", "max loss dB"]
                + ["stops"],
                rows,
            ),
        ]
    )
    result_file(stem, ".md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
