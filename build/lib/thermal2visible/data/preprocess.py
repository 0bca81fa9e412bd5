"""One raw pair -> model-sized arrays, and which split each pair goes to.

`normalise_frame` is the only road from a camera frame's values to the model's [0, 1]: the statistics come from
the training view (`crop_box`: the centre square, or the face box) and apply to the whole frame. The cache writer
cuts its training images out of it (`prepare_thermal`) and `inference.frames.translate_frame` translates all of it,
so a face reaches the model with the same values whatever hot or cold thing is beside it in the frame.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

import numpy as np
from skimage.filters import threshold_otsu
from skimage.measure import label, regionprops
from skimage.transform import resize

from thermal2visible.errors import PipelineError
from thermal2visible.config.schema import PreprocessConfig
from thermal2visible.pixels import on_uint16_scale, unit

Box = tuple[int, int, int]  # top, left, side of a square


def thermal_counts(image: np.ndarray) -> np.ndarray:
    """float32 HxWxC: integer frames in 16-bit counts (8-bit stretched onto them); float temperature
    maps in their own unit (°C or K, as the radiometric tool wrote them)."""
    counts = image.astype(np.float32) if image.dtype.kind == "f" else on_uint16_scale(image)
    return counts[:, :, None] if counts.ndim == 2 else counts


def centre_box(height: int, width: int) -> Box:
    side = min(height, width)
    return (height - side) // 2, (width - side) // 2, side


def face_box(counts: np.ndarray, margin: float) -> Box:
    """Square around the largest warm blob (Otsu threshold), grown by `margin` of its side on every side."""
    grey = counts.mean(axis=2)
    height, width = grey.shape
    if grey.min() == grey.max():
        return centre_box(height, width)
    blobs = regionprops(label(grey > threshold_otsu(grey)))
    top, left, bottom, right = max(blobs, key=lambda blob: blob.area).bbox
    side = min(round(max(bottom - top, right - left) * (1 + 2 * margin)), height, width)
    # Shift the box back inside the frame rather than pad: padding would invent pixels the camera never saw.
    row = int(np.clip((top + bottom - side) // 2, 0, height - side))
    col = int(np.clip((left + right - side) // 2, 0, width - side))
    return row, col, side


def crop_box(thermal: np.ndarray, settings: PreprocessConfig) -> Box:
    """The square both images of a pair are cut to, decided from the thermal image alone."""
    if settings.face_crop:
        return face_box(thermal_counts(thermal), settings.crop_margin)
    return centre_box(*thermal.shape[:2])


def _square(pixels: np.ndarray, box: Box) -> np.ndarray:
    top, left, side = box
    return pixels[top : top + side, left : left + side]


def _resize(pixels: np.ndarray, size: int) -> np.ndarray:
    resized = resize(pixels, (size, size, pixels.shape[2]), anti_aliasing=True)
    return np.clip(resized, 0.0, 1.0).astype(np.float32)


def check_thermal_units(image: np.ndarray, settings: PreprocessConfig) -> None:
    """A frame's units (integer counts or a float temperature map) must fit the normalisation: `temperature` ranges
    are in a float map's unit, `fixed` ranges in integer counts; mixing them would map every pixel to 0 or 1 without a
    word."""
    is_float = image.dtype.kind == "f"
    if settings.thermal_norm == "temperature" and not is_float:
        raise PipelineError(
            f"{image.dtype} thermal counts, but preprocess.thermal_norm: temperature maps a "
            "float temperature map (use thermal_norm: fixed or percentile for integer frames)"
        )
    if settings.thermal_norm == "fixed" and is_float:
        raise PipelineError(
            f"{image.dtype} temperature map, but preprocess.fixed_range is in integer counts "
            "(use thermal_norm: temperature with temperature_range, or percentile)"
        )


def thermal_range(counts: np.ndarray, settings: PreprocessConfig) -> tuple[float, float]:
    """The values that map to 0 and 1: percentiles of `counts` (the training view's), a fixed range of raw
    counts, or a fixed temperature range in the map's unit (the same temperature is the same grey in every frame)."""
    if settings.thermal_norm == "percentile":
        low, high = np.percentile(counts, settings.percentiles)  # float64, as the cache has always computed them
        return low, high
    return settings.temperature_range if settings.thermal_norm == "temperature" else settings.fixed_range


def apply_range(counts: np.ndarray, low: float, high: float) -> np.ndarray:
    """`counts` -> [0, 1] linearly, `low` -> 0 and `high` -> 1; values beyond the range clip."""
    if high <= low:  # a flat training view: nothing to stretch
        return np.zeros_like(counts)
    return np.clip((counts - low) / (high - low), 0.0, 1.0)


def normalise_frame(image: np.ndarray, settings: PreprocessConfig) -> tuple[np.ndarray, Box]:
    """A uint8/uint16/float HxW or HxWxC thermal frame -> (the whole frame as float32 HxWxC in [0, 1], the
    training view's box). The range comes from the training view alone, as in training: a radiator or a window
    elsewhere in the frame clips instead of rescaling the face."""
    check_thermal_units(image, settings)
    counts = thermal_counts(image)
    box = crop_box(image, settings)
    return apply_range(counts, *thermal_range(_square(counts, box), settings)), box


def training_view(normalised: np.ndarray, box: Box, settings: PreprocessConfig) -> np.ndarray:
    """The box of a `normalise_frame`d frame at the model's size: float32 (S, S, C) in [0, 1]."""
    return _resize(_square(normalised, box), settings.image_size)


def prepare_thermal(image: np.ndarray, settings: PreprocessConfig) -> np.ndarray:
    """A uint8/uint16/float HxW or HxWxC thermal frame -> float32 (S, S, C) in [0, 1]: what the model trains on."""
    return training_view(*normalise_frame(image, settings), settings)


def prepare_visible(image: np.ndarray, thermal: np.ndarray, settings: PreprocessConfig) -> np.ndarray:
    """The visible partner of `thermal` (uint8 or uint16) -> float32 (S, S, C) in [0, 1], cut to the same box."""
    return _resize(_square(unit(image), crop_box(thermal, settings)), settings.image_size)


def _counts(total: int, settings: PreprocessConfig, what: str) -> tuple[int, int]:
    """How many of `total` units go to val and test: at least one each when its fraction is not zero."""
    n_val, n_test = (max(1, round(f * total)) if f > 0 else 0 for f in (settings.val_fraction, settings.test_fraction))
    if n_val + n_test >= total:
        raise PipelineError(
            f"preprocess: {total} {what} are too few for val_fraction {settings.val_fraction} and "
            f"test_fraction {settings.test_fraction} (training would get none)"
        )
    return n_val, n_test


def sequence_of(relative: str) -> str:
    """The sequence (video, burst) a frame belongs to: its folder plus its file name without the trailing frame
    number, so `thermal/anna/walk_0001.png` and `thermal/anna/walk_0002.png` are both `thermal/anna/walk`, and
    every frame of a folder of bare numbers (`clip7/0001.png`) belongs to `clip7`."""
    path = PurePosixPath(relative)
    return (path.parent / re.sub(r"[-_. ]*\d+$", "", path.stem)).as_posix()


def assign_splits(
    identities: list[str | None],
    hints: list[str | None],
    settings: PreprocessConfig,
    sequences: list[str] | None = None,
) -> list[str]:
    """Split of each pair: its folder hint when it has one, else `split_by` over the pairs without one
    (`identity`, `sequence` (from `sequence_of`): whole groups go to one split; `random`: each pair alone)."""
    free = [i for i, hint in enumerate(hints) if hint is None]
    splits = list(hints)
    rng = np.random.default_rng(settings.seed)
    if settings.split_by == "identity":
        missing = [i for i in free if identities[i] is None]
        if missing:
            raise PipelineError(
                f"preprocess.split_by: identity needs an identity folder for every pair; "
                f"{len(missing)} pairs have none (use split_by: sequence or random)"
            )
    groups = {"identity": identities, "sequence": sequences, "random": range(len(hints))}[settings.split_by]
    unit_of = {i: groups[i] for i in free}
    units = sorted(set(unit_of.values()))
    if not units:
        return splits
    what = {"identity": "identities", "sequence": "sequences", "random": "pairs"}[settings.split_by]
    n_val, n_test = _counts(len(units), settings, what)
    order = [units[k] for k in rng.permutation(len(units))]
    split_of = {
        unit: "test" if k < n_test else "val" if k < n_test + n_val else "train" for k, unit in enumerate(order)
    }
    for i in free:
        splits[i] = split_of[unit_of[i]]
    return splits
