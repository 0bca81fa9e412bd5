"""Registration of a camera rig: the one transform that lays each visible frame onto its thermal partner.

A thermal and a visible camera side by side differ by a fixed parallax and field of view: the same scene point
lands a few pixels apart and at a slightly different scale in the two frames. The rig is rigid, so one similarity
transform (scale, rotation, shift) serves every pair of a dataset; it is estimated from the training pairs only.

Thermal and visible intensities are unrelated (a warm face is bright, a dark-haired one dark), but both cameras see
the same outlines: the estimate compares gradient magnitudes (Sobel) of the two frames. For a candidate scale and
rotation each training pair gets its best shift by phase correlation (scikit-image) and a score, the normalised
correlation of the two gradient images at that shift; the rig's scale and rotation are those scoring best over the
pairs, its shift the median of the pairs' shifts. A pair's residual is how far its own best shift lies from the
rig's, in thermal pixels: a pair the rig transform cannot lay onto its partner (a wrong partner, a moved camera)
stands out by it, unless the pair has too little texture to measure: a frame whose values change by less than one of
its own counts from pixel to pixel (a plain sky or wall in 8 bits) has for outlines its quantisation bands, which
the other camera does not share, and its best shift is theirs, not the rig's; such a pair is reported as unmeasured,
not as misaligned.
docs/data.md gives the measurements behind each choice.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from skimage.color import rgb2gray
from skimage.filters import sobel
from skimage.registration import phase_cross_correlation
from skimage.transform import AffineTransform, resize, warp

from thermal2visible.config.schema import PreprocessConfig
from thermal2visible.data.preprocess import normalise_frame
from thermal2visible.errors import PipelineError
from thermal2visible.pixels import quantise, unit

WORK_SIDE = 128  # frames are compared at most this big (shorter side): precise enough, fast on big frames
ESTIMATE_PAIRS = 24  # training pairs the rig is estimated from, evenly spread: the rig is one for all
COARSE_SCALES = np.linspace(0.85, 1.15, 31)  # 1 % steps over +-15 %, then 0.1 % steps around the best
COARSE_ROTATIONS = np.deg2rad(np.linspace(-3, 3, 7))  # 1 degree steps, then 0.1 degree steps
FINE_STEPS = np.linspace(-1, 1, 21)
SUBPIXEL = 20  # phase correlation's upsampling: shifts to 1/20 px
REGISTERED_PX = 0.5  # a rig moving no pixel farther than this is registered already: resampling would only blur


@dataclass(frozen=True)
class Rig:
    """visible pixel = scale * R(rotation) (thermal pixel - frame centre) + frame centre + shift, in pixels
    (x, y) = (column, row): where the visible camera saw what the thermal camera saw at a pixel."""

    scale: float
    rotation: float  # radians
    shift: tuple[float, float]

    def matrix(self, height: int, width: int) -> np.ndarray:
        """3x3 homogeneous map from thermal to visible pixel coordinates of a height x width frame."""
        c, s = np.cos(self.rotation) * self.scale, np.sin(self.rotation) * self.scale
        linear = np.array([[c, -s], [s, c]])
        centre = np.array([(width - 1) / 2, (height - 1) / 2])
        offset = centre + np.array(self.shift) - linear @ centre
        return np.vstack([np.hstack([linear, offset[:, None]]), [0, 0, 1]])

    def displacement(self, height: int, width: int) -> float:
        """The farthest any pixel of a height x width frame moves under this transform, in pixels."""
        corners = np.array([[0, 0], [width - 1, 0], [0, height - 1], [width - 1, height - 1]], float)
        moved = AffineTransform(matrix=self.matrix(height, width))(corners)
        return float(np.abs(moved - corners).max())

    def as_dict(self) -> dict:
        return {
            "scale": self.scale,
            "rotation_degrees": float(np.rad2deg(self.rotation)),
            "shift_px": [float(v) for v in self.shift],
        }

    @staticmethod
    def from_dict(stored: dict) -> "Rig":
        return Rig(stored["scale"], float(np.deg2rad(stored["rotation_degrees"])), tuple(stored["shift_px"]))


IDENTITY = Rig(1.0, 0.0, (0.0, 0.0))


def _warped(image: np.ndarray, rig: Rig, mode: str) -> np.ndarray:
    map_ = AffineTransform(matrix=rig.matrix(*image.shape[:2]))
    return warp(image, map_, order=1, mode=mode, cval=0.0, preserve_range=True).astype(np.float32)


def apply_rig(visible: np.ndarray, rig: Rig) -> np.ndarray:
    """The visible frame resampled onto the thermal frame's pixels, float32 [0, 1], same size. Where the visible
    camera saw nothing the nearest edge pixel is repeated (mode edge), so no black border enters training."""
    return _warped(unit(visible), rig, "edge")


def _work_factor(height: int, width: int) -> float:
    return min(1.0, WORK_SIDE / min(height, width))


def _edges(grey: np.ndarray, factor: float) -> np.ndarray:
    if factor < 1:
        grey = resize(grey, (round(grey.shape[0] * factor), round(grey.shape[1] * factor)), anti_aliasing=True)
    edges = sobel(grey)
    return ((edges - edges.mean()) / (edges.std() + 1e-12)).astype(np.float32)


def edge_images(thermal: np.ndarray, visible: np.ndarray, settings: PreprocessConfig) -> tuple[np.ndarray, np.ndarray]:
    """(thermal, visible) gradient magnitudes, standardised, at the working size: the two modalities' common
    ground (their outlines), where their intensities have none."""
    factor = _work_factor(*thermal.shape[:2])
    grey_thermal = normalise_frame(thermal, settings)[0].mean(axis=2)
    pixels = unit(visible)
    grey_visible = rgb2gray(pixels) if pixels.shape[2] == 3 else pixels[..., 0]
    return _edges(grey_thermal, factor), _edges(grey_visible, factor)


def _pair_shift(thermal_edges: np.ndarray, moved: np.ndarray, upsample: int) -> tuple[np.ndarray, float]:
    """(x, y) shift of the moved visible outlines against the thermal ones, and their correlation once undone."""
    row_col, _, _ = phase_cross_correlation(thermal_edges, moved, upsample_factor=upsample, normalization=None)
    shift = -row_col[::-1]
    back = _warped(moved, Rig(1.0, 0.0, tuple(shift)), "constant")
    return shift, float(np.mean(thermal_edges * back))


def _score(pairs: list[tuple], scale: float, rotation: float) -> float:
    """How well the pairs' outlines agree under (scale, rotation), each pair at its own best shift."""
    rig = Rig(scale, rotation, (0.0, 0.0))
    return float(np.median([_pair_shift(t, _warped(v, rig, "constant"), 2)[1] for t, v in pairs]))


def _best(pairs: list[tuple], scales, rotations) -> tuple[float, float]:
    scored = {(s, r): _score(pairs, s, r) for s in scales for r in rotations}
    return max(scored, key=scored.get)


def estimate_rig(pairs: list[tuple[np.ndarray, np.ndarray]], settings: PreprocessConfig) -> Rig:
    """The rig transform from (thermal, visible) raw training frames: scale, then rotation, coarse then fine,
    then the median of the pairs' shifts (robust to a few odd pairs)."""
    edges = [edge_images(thermal, visible, settings) for thermal, visible in pairs]
    scale, _ = _best(edges, COARSE_SCALES, [0.0])
    _, rotation = _best(edges, [scale], COARSE_ROTATIONS)
    scale, _ = _best(edges, scale + 0.01 * FINE_STEPS, [rotation])
    _, rotation = _best(edges, [scale], rotation + np.deg2rad(1.0) * FINE_STEPS)
    rig = Rig(scale, rotation, (0.0, 0.0))
    # a shift measured on the warped outlines is in thermal pixels before scale and rotation: map it, then back
    # from the working size to the frame's
    measured = []
    for (thermal, _), (t, v) in zip(pairs, edges):
        shift, _ = _pair_shift(t, _warped(v, rig, "constant"), SUBPIXEL)
        linear = rig.matrix(1, 1)[:2, :2]
        measured.append(linear @ shift / _work_factor(*thermal.shape[:2]))
    return Rig(float(scale), float(rotation), tuple(float(v) for v in np.median(measured, axis=0)))


def quantisation_bound(image: np.ndarray) -> bool:
    """Whether an integer frame's values change by less than one count between neighbouring pixels on average: its
    outlines are then mostly its own quantisation steps (the bands of a plain sky or wall in 8 bits), which the other
    camera's frame does not share, so they cannot measure an offset. A float frame has no count to compare with."""
    if image.dtype.kind == "f":
        return False
    counts = image.astype(np.float32)
    return float(np.abs(np.diff(counts, axis=0)).mean() + np.abs(np.diff(counts, axis=1)).mean()) < 1.0


@dataclass(frozen=True)
class Fit:
    """One pair against the rig: how far apart its outlines still lie, and whether its texture can tell."""

    residual: float  # thermal pixels from the rig's placement to the pair's own best shift
    # False: the residual exceeds preprocess.align_max_residual, but one of the frames is too plain to measure it
    # (quantisation_bound): not evidence of a misaligned pair
    measured: bool


def residual(thermal: np.ndarray, visible: np.ndarray, rig: Rig, settings: PreprocessConfig) -> Fit:
    """How far (thermal pixels) this pair's outlines still lie apart once the rig transform is applied, and whether
    an offset beyond the tolerance is measured or only noise of a texture too plain to measure (module docstring)."""
    t, v = edge_images(thermal, apply_rig(visible, rig), settings)
    shift, _ = _pair_shift(t, v, SUBPIXEL)
    offset = float(np.hypot(*shift) / _work_factor(*thermal.shape[:2]))
    plain = quantisation_bound(thermal) or quantisation_bound(visible)
    return Fit(offset, offset <= settings.align_max_residual or not plain)


Frames = tuple[np.ndarray, np.ndarray]  # (thermal, visible) as decoded


@dataclass(frozen=True)
class Registration:
    """What the training pairs say about the rig, and what preprocess does with it."""

    estimated: Rig
    applied: Rig | None  # None: frames left as they are (align off, or the rig is registered already)
    fits: list[Fit]  # per pair, measured after `applied`
    refused: list[int]  # measured pairs whose residual exceeds preprocess.align_max_residual (align on only)


def register(
    pairs: Sequence[dict],
    splits: Sequence[str],
    read: Callable[[dict], Frames],
    settings: PreprocessConfig,
    map_pairs: Callable = map,
) -> Registration:
    """Estimate the rig from the training pairs, decide whether to apply it, and measure every pair against it
    (through `map_pairs`, which may spread the pairs over processes: `read` must then pickle).
    One transform for the whole dataset: a rig's parallax and field of view are fixed by its mount and lenses,
    and a single sequence (a few near-identical frames) would pin it down less well than all training pairs."""
    training = [pair for pair, split in zip(pairs, splits) if split == "train"]
    if not training:
        raise PipelineError("preprocess.align: no training pairs to estimate the camera rig from")
    training = [read(pair) for pair in training[:: max(1, len(training) // ESTIMATE_PAIRS)][:ESTIMATE_PAIRS]]
    estimated = estimate_rig(training, settings)
    height, width = training[0][0].shape[:2]
    applied = estimated if settings.align and estimated.displacement(height, width) > REGISTERED_PX else None
    fits = list(map_pairs(functools.partial(read_residual, read, applied or IDENTITY, settings), pairs))
    refused = (
        [i for i, fit in enumerate(fits) if fit.measured and fit.residual > settings.align_max_residual]
        if settings.align
        else []
    )
    return Registration(estimated, applied, fits, refused)


def read_residual(read: Callable[[dict], Frames], rig: Rig, settings: PreprocessConfig, pair: dict) -> Fit:
    return residual(*read(pair), rig, settings)


def aligned(frames: Frames, rig: Rig | None) -> Frames:
    """A decoded pair with its visible frame laid onto the thermal one (unchanged when `rig` is None)."""
    thermal, visible = frames
    return thermal, visible if rig is None else apply_rig(visible, rig)


def overlay(frames: Sequence[Frames], rig: Rig | None, settings: PreprocessConfig) -> np.ndarray:
    """uint8 RGB rows of pairs, before | after: thermal in magenta, visible in green, so what lies in register is
    grey and what does not shows coloured fringes."""

    def blend(thermal: np.ndarray, visible: np.ndarray) -> np.ndarray:
        heat = normalise_frame(thermal, settings)[0].mean(axis=2)
        pixels = unit(visible)
        grey = rgb2gray(pixels) if pixels.shape[2] == 3 else pixels[..., 0]
        return np.stack([heat, grey, heat], axis=-1)

    frames = [pair for pair in frames if pair[0].shape[:2] == frames[0][0].shape[:2]]  # one picture, one size
    rows = [
        np.concatenate([blend(*pair), np.ones((pair[0].shape[0], 2, 3)), blend(*aligned(pair, rig))], axis=1)
        for pair in frames
    ]
    gap = np.ones((2, rows[0].shape[1], 3))
    return quantise(np.concatenate([part for row in rows for part in (row, gap)][:-1], axis=0), np.uint8)
