"""Full-frame, geometry-true translation of one thermal frame of any size: the one road from a camera frame to a
visible frame, used by REST serving, batch translation (folders and video) and full-frame evaluation.

The frame is normalised as training normalises (`preprocess.normalise_frame`: the range comes from the training
view, the centre square or the face box, and applies to the whole frame, so hot or cold things beside the face clip
instead of rescaling it), scaled by image_size / min(H, W) (`model_size`: the scale at which a centre-cropped
training frame reached the model), translated whole, and scaled back to
exactly H x W: every output pixel comes from the input pixel at the same place, so the output lies in register
with the input whatever its aspect. Two ways to run the generator (U-Net or ResNet: both take sides that are
multiples of image_size) on a frame that is not the training square:

- `pad`: reflect-pad to the next multiple and run the network once, fully convolutionally (the ONNX graph
  has dynamic height and width); the innermost levels then see the whole frame at once.
- `tile`: image_size squares with half-tile overlap, blended with a weight that falls to the tile edges, so
  the network sees exactly the field of view it was trained on.

`METHOD` is the one chosen by measurement (docs/serving.md; benchmarks/full_frame.py). With
`face_crop`, the face box is also translated exactly as in training and pasted back into the box it came from.
"""

from __future__ import annotations

from typing import Callable, Literal

import numpy as np
from skimage.transform import resize

from thermal2visible.config.schema import PreprocessConfig
from thermal2visible.data.preprocess import normalise_frame, training_view
from thermal2visible.pixels import from_model, nhwc, to_model

Generate = Callable[[np.ndarray], np.ndarray]  # (N,Ct,H,W) float32 in [-1,1] -> (N,Cv,H,W) in [-1,1]
Method = Literal["pad", "tile"]
METHOD: Method = "tile"
TILE_BATCH = 16  # tiles per generator call: bounds memory on big frames


def _resized(image: np.ndarray, height: int, width: int) -> np.ndarray:
    shrinking = height < image.shape[0] or width < image.shape[1]
    return resize(image, (height, width, image.shape[2]), anti_aliasing=shrinking).astype(np.float32)


def _padded(generate: Generate, image: np.ndarray, multiple: int) -> np.ndarray:
    height, width = image.shape[:2]
    extra_h, extra_w = (-height) % multiple, (-width) % multiple
    top, left = extra_h // 2, extra_w // 2
    padded = np.pad(image, ((top, extra_h - top), (left, extra_w - left), (0, 0)), mode="reflect")
    return nhwc(generate(to_model(padded)))[0, top : top + height, left : left + width]


def _starts(length: int, side: int) -> list[int]:
    """Tile origins along one axis: every half tile, the last one flush with the end."""
    return sorted({*range(0, length - side, side // 2), length - side})


def _tiled(generate: Generate, image: np.ndarray, side: int) -> np.ndarray:
    height, width = image.shape[:2]
    origins = [(row, col) for row in _starts(height, side) for col in _starts(width, side)]
    ramp = 1.0 - np.abs(np.linspace(-1.0, 1.0, side, dtype=np.float32)) + 1e-3  # > 0: an edge-only pixel still counts
    weight = np.outer(ramp, ramp)[:, :, None]
    blended, total = None, np.zeros((height, width, 1), np.float32)
    for start in range(0, len(origins), TILE_BATCH):
        chunk = origins[start : start + TILE_BATCH]
        outputs = nhwc(generate(to_model(np.stack([image[r : r + side, c : c + side] for r, c in chunk]))))
        if blended is None:
            blended = np.zeros((height, width, outputs.shape[3]), np.float32)
        for (row, col), output in zip(chunk, outputs):
            blended[row : row + side, col : col + side] += weight * output
            total[row : row + side, col : col + side] += weight
    return blended / total


def model_size(height: int, width: int, side: int) -> tuple[int, int]:
    """(rows, cols) of a height x width frame scaled by side / its shorter side, at least side x side: what the
    model runs on, and so the work a frame costs (a thin frame grows: 8000x1 becomes 512000x64 at side 64)."""
    scale = side / min(height, width)
    return max(side, round(height * scale)), max(side, round(width * scale))


def translate_frame(
    generate: Generate, frame: np.ndarray, settings: PreprocessConfig, method: Method = METHOD
) -> np.ndarray:
    """One thermal frame (HxW or HxWxC; uint8, uint16 or float temperatures) -> the visible frame as float32
    H x W x Cv in [0, 1]: same height and width, content in register with the input.

    `settings` is the preprocess section the model was trained with; raises PipelineError when the frame's kind does
    not fit its normalisation (integer counts for `temperature`, float temperatures for `fixed`)."""
    normalised, box = normalise_frame(frame, settings)
    height, width = frame.shape[:2]
    side = settings.image_size
    scaled = _resized(normalised, *model_size(height, width, side))
    generated = _padded(generate, scaled, side) if method == "pad" else _tiled(generate, scaled, side)
    visible = np.clip(_resized(from_model(generated), height, width), 0.0, 1.0)
    if settings.face_crop:
        top, left, box_side = box
        face = nhwc(generate(to_model(training_view(normalised, box, settings))))[0]
        visible[top : top + box_side, left : left + box_side] = np.clip(
            _resized(from_model(face), box_side, box_side), 0.0, 1.0
        )
    return visible
