"""PSNR of whole translated frames against the real ones, in numpy (scikit-image's peak_signal_noise_ratio): the
evaluate stage's psnr_full_frame and the register stage's champion gate score frames onnxruntime translated, so
neither needs torch for it (metrics.py scores batches of model outputs in torch, to the same definitions)."""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np
from skimage.metrics import peak_signal_noise_ratio

from thermal2visible.pixels import unit


def frame_psnr(predicted: np.ndarray, real: np.ndarray) -> float:
    """PSNR in dB of one HxW[xC] frame against the real one (pixels as `pixels.unit` reads them)."""
    return float(peak_signal_noise_ratio(unit(real), unit(predicted), data_range=1.0))


def full_frame_psnr(
    translate: Callable[[np.ndarray], np.ndarray], pairs: Iterable[tuple[np.ndarray, np.ndarray]]
) -> float:
    """Mean `frame_psnr` of `translate(thermal)` (e.g. inference.frames.translate_frame) against the real visible
    frames, at their full size."""
    return float(np.mean([frame_psnr(translate(thermal), visible) for thermal, visible in pairs]))
