"""The tables and figures of pipelines/study.py's studies. Each builder runs its configurations through the runner
it is given (`run_all`: named points at once, through DVC's queue; `run`: one point, in a scratch project) and
returns its markdown table and its figures by name; a figure named after its study takes the report's name."""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib
import torch

from thermal2visible.config.load import preset_overrides
from thermal2visible.data.dataset import in_order
from thermal2visible.models.generator import as_tested
from thermal2visible.models.payloads import load_generator
from thermal2visible.paths import GENERATOR, PIX2PIX_DEFAULT
from .scratch import child_project
from thermal2visible.tracking.plots import image_rows
from thermal2visible.training.precision import resolve_accelerator, resolve_precision

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

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
    "multi-scale D": ("model.discriminator_settings.scales=2",),
    "feature matching": ("train.lambda_feat=10",),
    "ResNet generator": ("model.generator=resnet",),
}
GRID_FACES = 8


def markdown(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]) + "\n"


def experiments_line(children: list[dict]) -> str:
    names = [child["dvc_experiment"] for child in children if child["dvc_experiment"]]
    return f"DVC experiments (`dvc exp show`, `dvc exp apply NAME`): {', '.join(names)}.\n\n" if names else ""


def dB(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def batch_study(run_all, values: list[int]) -> tuple[str, dict]:
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


def lr_study(run_all, values: list[int]) -> tuple[str, dict]:
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


def speed_study(run, values: list[int], workers: list[int]) -> tuple[str, dict]:
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


def quality_study(run, seeds: list[int], minutes: float, cache: Path, work: Path) -> tuple[str, dict]:
    """Every configuration trained for `minutes` of wall clock per seed, seeds in turn, the order of the
    configurations rotated from seed to seed (so none always runs on a fresher machine); then the best combination:
    the changes that beat the default's mean validation PSNR (the best smoothed one each run kept), or the two best
    changes when fewer than two did. Every choice and verdict is on validation; the test scores stand beside them."""
    budget = [f"train.max_minutes={minutes}", "train.max_epochs=100000"]  # the clock ends a run (or early stopping)
    configs = {"default": (), **QUALITY_CHANGES}
    results: dict[str, list[dict]] = {name: [] for name in configs}
    for turn, seed in enumerate(seeds):
        names = list(configs)[turn % len(configs) :] + list(configs)[: turn % len(configs)]
        for name in names:
            results[name].append(run(f"{name} seed {seed}", [*budget, *configs[name], f"train.seed={seed}"]))
    psnr = {name: [child["best_psnr_smoothed"] for child in children] for name, children in results.items()}
    ranked = sorted(QUALITY_CHANGES, key=lambda name: statistics.mean(psnr[name]), reverse=True)
    winners = [name for name in ranked if statistics.mean(psnr[name]) > statistics.mean(psnr["default"])]
    combined = winners if len(winners) >= 2 else ranked[:2]
    configs["best combination"] = tuple(change for name in combined for change in QUALITY_CHANGES[name])
    results["best combination"] = [
        run(f"best combination seed {seed}", [*budget, *configs["best combination"], f"train.seed={seed}"])
        for seed in seeds
    ]
    psnr["best combination"] = [child["best_psnr_smoothed"] for child in results["best combination"]]

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
            "validation PSNR per seed (dB)",
            "mean validation PSNR (dB)",
            "mean test PSNR (dB)",
            "mean test SSIM",
            "identity (mean)",
            "epochs in the budget",
            "images/s",
            "vs default (validation PSNR)",
        ],
        [
            [
                name,
                " ".join(configs[name]) or "params.yaml",
                " / ".join(dB(v) for v in psnr[name]),
                dB(statistics.mean(psnr[name])),
                mean(name, lambda c: c["eval"]["generator"]["psnr"]),
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
        ylabel="validation PSNR (dB): mean bar, seeds dots",
        title=f"Quality at equal training time ({minutes} min per run)",
    )
    return table, {"quality": bars, "quality_grid": faces_grid(results, cache, work)}


@torch.inference_mode()
def faces_grid(results: dict[str, list[dict]], cache: Path, work: Path) -> plt.Figure:
    """The same first test faces: thermal, each configuration's generator (first seed), real."""
    batch = next(in_order(cache, "test", GRID_FACES))
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
