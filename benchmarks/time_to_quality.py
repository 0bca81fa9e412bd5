"""Time to quality, the analogue of the paper's 7.08x: wall-clock until the best smoothed validation PSNR for the
pix2pix default setup (batch 1, fp32, NCHW, plain Adam, memory-mapped input) vs the optimized one (larger batch,
bf16-mixed, channels_last, fused Adam, preloaded input), and the PSNR each reaches.

Both are real `pipelines/train.py` runs on the demo data (this project's data/ingested, preprocessed by
pipelines/preprocess.py), each in a scratch project, with the same early stopping (window/patience scaled down
from the paper's 50/50 with flags). Time to best = the MLflow timestamp of the best epoch's validation PSNR minus
the run's start. The child-run machinery is pipelines/study.py's.

Writes reports/time_to_quality.json and reports/time_to_quality.png.
Usage: python benchmarks/time_to_quality.py [--batch 8] [--window 5] [--patience 8] [--max-epochs 60] [--set ...]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from common import REPORTS, machine, markdown_table, write_report  # noqa: E402

from thermal2visible.config import preset_overrides  # noqa: E402
from thermal2visible.paths import PIX2PIX_DEFAULT  # noqa: E402
from thermal2visible.study import prepare_cache, train_child  # noqa: E402
from thermal2visible.training.trainer import resolve_precision  # noqa: E402

OPTIMIZED = ("train.precision=auto", "train.channels_last=true", "train.fused_adam=true", "loader.preload=true")


def plot(children: dict, path: Path) -> None:
    figure, axes = plt.subplots(figsize=(7.5, 4))
    for name, child in children.items():
        seconds = child["psnr_seconds"]
        line, = axes.plot(seconds, [float("nan") if v is None else v for v in child["psnr_smoothed"]], linewidth=2,
                          label=f"{name}: best {child['best_psnr_smoothed']:.2f} dB after {child['time_to_best_s']} s")
        axes.plot(seconds, child["psnr"], color=line.get_color(), alpha=0.3, linewidth=1)
        axes.axvline(child["time_to_best_s"], color=line.get_color(), linestyle=":")
    axes.set(xlabel="seconds since the run started", ylabel="validation PSNR (dB)",
             title="Time to the best smoothed PSNR")
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="batch size of the optimized run")
    parser.add_argument("--workers", type=int, default=1, help="train.devices of the optimized run")
    parser.add_argument("--lr-scaling", default="none", choices=["none", "sqrt", "linear"],
                        help="train.lr_scaling of the optimized run (its batch over the default's batch 1)")
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--patience", type=int, default=8)
    parser.add_argument("--max-epochs", type=int, default=60)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    args = parser.parse_args()
    common = [f"early_stop.window={args.window}", f"early_stop.patience={args.patience}",
              f"train.max_epochs={args.max_epochs}", "train.image_log_every=0", *args.overrides]
    optimized = [*OPTIMIZED, f"train.batch_size={args.batch}", f"train.devices={args.workers}",
                 f"train.lr_scaling={args.lr_scaling}"]
    precision = resolve_precision("auto", "cpu")
    optimized_name = f"optimized (batch {args.batch}, {precision}, all, lr scaling {args.lr_scaling})"
    configs = {"pix2pix default (batch 1, fp32)": [*common, *preset_overrides(PIX2PIX_DEFAULT), "train.batch_size=1"],
               optimized_name: [*common, *optimized]}
    with tempfile.TemporaryDirectory(prefix="t2v-ttq-") as work:
        cache = prepare_cache(Path(work), args.params, args.overrides)
        children = {}
        for name, overrides in configs.items():
            print(f"{name} ...", flush=True)
            children[name] = train_child(Path(work), name, cache, args.params, overrides)
    (default, base), (optimized, fast) = children.items()
    speedup = base["time_to_best_s"] / fast["time_to_best_s"]
    # Time to the same quality: the first moment each run's smoothed PSNR reaches the lower of the two bests
    # (psnr.csv, where the curve comes from, rounds to 4 decimals).
    target = round(min(base["best_psnr_smoothed"], fast["best_psnr_smoothed"]), 4)
    for child in children.values():
        reached = zip(child["psnr_seconds"], child["psnr_smoothed"])
        child["time_to_target_s"] = next(seconds for seconds, value in reached if value is not None and value >= target)
    same_quality = base["time_to_target_s"] / fast["time_to_target_s"]
    print(markdown_table(["configuration", "best smoothed PSNR (dB)", "best epoch", "stop epoch", "time to best (s)",
                          f"time to {target:.2f} dB (s)", "wall (s)", "images/s"],
                         [[name, round(c["best_psnr_smoothed"], 2), c["best_epoch"], c["stopped_epoch"],
                           c["time_to_best_s"], c["time_to_target_s"], c["wall_s"], c["images_per_s"]]
                          for name, c in children.items()]))
    print(f"time to the same quality ({target:.2f} dB smoothed PSNR): x{same_quality:.2f}; time to each run's best: "
          f"x{speedup:.2f} faster ({machine()['cpu']}, {machine()['cores']} cores, torch threads "
          f"{torch.get_num_threads()} per process)")
    write_report("time_to_quality", {"speedup_time_to_best": round(speedup, 2), "target_psnr": round(target, 2),
                                     "speedup_time_to_target": round(same_quality, 2), "runs": children,
                                     "window": args.window, "patience": args.patience})
    plot(children, REPORTS / "time_to_quality.png")
    print(f"wrote {REPORTS}/time_to_quality.json and .png")


if __name__ == "__main__":
    main()
