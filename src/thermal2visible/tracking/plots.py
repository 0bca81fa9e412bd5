"""The pictures a run logs: the PSNR curve (the paper's Fig. 4) and thermal | generated | real grids."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib
import numpy as np
import torch

from thermal2visible.pixels import from_model, quantise, with_channels

matplotlib.use("Agg")  # files only, never a window
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


def _as_rgb(images: torch.Tensor) -> np.ndarray:
    """(B,C,S,S) in [-1,1], C 1 or 3 -> (B,S,S,3) uint8."""
    unit = with_channels(from_model(images.detach().float().cpu()), 3)
    return quantise(unit.permute(0, 2, 3, 1).numpy(), np.uint8)


def image_rows(*rows: torch.Tensor, gap: int = 2) -> np.ndarray:
    """One row per (B,C,S,S) batch in [-1,1], one column per image, white gaps between; uint8 RGB."""
    pictures = [_as_rgb(images) for images in rows]
    count, side = pictures[0].shape[:2]
    grid = np.full((len(rows) * (side + gap) - gap, count * (side + gap) - gap, 3), 255, np.uint8)
    for r, row in enumerate(pictures):
        for c, image in enumerate(row):
            grid[r * (side + gap) : r * (side + gap) + side, c * (side + gap) : c * (side + gap) + side] = image
    return grid


def comparison_grid(thermal: torch.Tensor, generated: torch.Tensor, real: torch.Tensor) -> np.ndarray:
    """Rows thermal | generated | real, one column per face (as the paper's Fig. 5/6); uint8 RGB."""
    return image_rows(thermal, generated, real)


def save_grid(grid: np.ndarray, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    plt.imsave(path, grid)


def save_psnr_curve(
    path: str | Path,
    history: Sequence[float],
    smoothed: Sequence[float | None],
    best_epoch: int,
    stopped_epoch: int,
    window: int,
) -> None:
    """Raw and smoothed validation PSNR per epoch, the best smoothed epoch and the stop (the paper's Fig. 4)."""
    epochs = np.arange(1, len(history) + 1)
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(epochs, history, color="0.7", linewidth=1, label="PSNR")
    smooth = np.array([np.nan if value is None else value for value in smoothed], dtype=float)
    axes.plot(epochs, smooth, color="tab:blue", linewidth=2, label=f"moving average ({window} epochs)")
    if best_epoch:
        axes.plot(
            best_epoch,
            smooth[best_epoch - 1],
            "o",
            color="tab:green",
            markersize=8,
            label=f"best: epoch {best_epoch}, {smooth[best_epoch - 1]:.2f} dB",
        )
    axes.axvline(stopped_epoch, color="tab:red", linestyle="--", label=f"stopped: epoch {stopped_epoch}")
    axes.set(xlabel="epoch", ylabel="validation PSNR (dB)", title="PSNR early stopping")
    axes.legend(loc="lower right")
    axes.grid(alpha=0.3)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
