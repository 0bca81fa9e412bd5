"""The served model: an MLflow pyfunc that turns base64 thermal images into base64 PNG visible images.

One row per image in an `image` column: a base64 PNG, JPEG or TIFF thermal frame of any size and aspect; 8- or
16-bit integer, or a float32/float64 TIFF temperature map (when the model was trained on them); grey or RGB as
the model was trained. What comes back, one row per request row, in the same order: an `image` column of base64
8-bit PNG visible frames (RGB or grey as trained) of exactly the request frame's width x height, in register
with it: `frames.translate_frame` translates the whole frame with training's own normalisation (settings
stored in the .onnx metadata) and the ONNX generator under onnxruntime; with `face_crop` the face box is
translated as in training and pasted back where it was. REST (`mlflow models serve`), batch and video
translation (pipelines/translate.py) all call this class.

A request the model cannot use raises a ServingError (INVALID_PARAMETER_VALUE), which the scoring server
answers with 400 and the message (naming the row); anything else is a bug in this code and answers 500
without the traceback, which goes to the server log instead. What one request may cost is bounded
before any pixel is decoded (`ServedLimits`): its rows, each image's pixels from its header (depth, samples and
pages included), the pixels summed over its rows, and the pixels a frame costs the model (`frames.model_size`: a
thin frame grows when scaled to the training size). During the work, a request that has used its CPU-seconds
stops with a 400, and one the scoring server has already answered 504 (its timeout passed) stops at the next step,
so no abandoned request keeps its worker busy. `make serve` runs this class inside worker processes under OS limits
(inference.rest); in one process, requests run one at a time: the model already uses every core.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import threading
import time

import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INTERNAL_ERROR, TEMPORARILY_UNAVAILABLE
from PIL import Image

from thermal2visible.data.images import BadImage, decode_image, image_size
from thermal2visible.errors import PipelineError
from thermal2visible.inference.frames import model_size, translate_frame
from thermal2visible.inference.session import (
    RunTimeLimit,
    check_runs,
    check_trained_with,
    exported_settings,
    onnx_session,
    run_onnx,
)
from thermal2visible.pixels import quantise
from thermal2visible.inference.request_budget import ServedLimits, ServingError, Work, bad_request, row_bytes

IMAGE = "image"
TRAINING_MANIFEST = "training_manifest"  # the pyfunc artifact holding the cache manifest a version trained on


log = logging.getLogger(__name__)


def to_base64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def png_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


class ThermalToVisible(mlflow.pyfunc.PythonModel):
    """artifacts: {"onnx": the generator from `export`}; model_config: `ServedLimits` as a dict."""

    def load_context(self, context) -> None:
        # OMP_NUM_THREADS, when set, caps onnxruntime's threads as it caps torch's: a server's worker sets it to 1
        threads = os.environ.get("OMP_NUM_THREADS", "")
        self.load(context.artifacts["onnx"], context.model_config, int(threads) if threads.isdigit() else None)
        self.training_manifest = context.artifacts.get(TRAINING_MANIFEST)  # optional: pyfunc_arguments
        if self.training_manifest is not None:
            check_trained_with(self.preprocess, self.training_manifest, self.onnx)

    def load(self, onnx: str, model_config: dict, threads: int | None = None) -> None:
        """The ONNX session, its checked settings and the limits; `threads`: onnxruntime's intra-op threads (None:
        one per core)."""
        self.onnx, self.model_config = onnx, model_config
        self.session = onnx_session(onnx, threads)
        settings = exported_settings(self.session, onnx)
        self.limits = ServedLimits(**model_config)
        check_runs(self.session, settings, onnx, self.limits.max_model_pixels, self.limits.max_check_seconds)
        self.preprocess = settings.preprocess
        self.in_channels = settings.in_channels
        self.max_pixels = self.limits.max_pixels
        self.one_at_a_time = threading.Lock()

    def check_work(self, height: int, width: int, where: str) -> None:
        """A 400 naming `where`, the frame's size and the limit when the model would run on more than
        `max_model_pixels` pixels: decided from the size alone, before any model call."""
        rows, cols = model_size(height, width, self.preprocess.image_size)
        if rows * cols > self.limits.max_model_pixels:
            raise bad_request(
                f"{where}: a {width}x{height} frame runs through the model at {cols}x{rows} = "
                f"{rows * cols} pixels (scaled by image_size {self.preprocess.image_size} / its shorter "
                f"side), over max_model_pixels {self.limits.max_model_pixels} (refused before translating)"
            )

    def check_request(self, images: list[bytes]) -> None:
        """Every image's header, and the request's pixels summed over its rows, before any image is decoded."""
        total = 0
        for row, data in enumerate(images):
            try:
                width, height = image_size(data, f"row {row}", self.limits.max_pixels)
            except BadImage as error:
                raise bad_request(str(error)) from None
            self.check_work(height, width, f"row {row}")
            total += width * height
        budget = self.limits.max_request_pixels
        if budget is not None and total > budget:
            raise bad_request(
                f"{len(images)} images of {total} pixels in all exceed serve.max_request_pixels {budget} "
                "(refused before decoding): send them in several requests"
            )

    def frame(self, data: bytes, row: int) -> np.ndarray:
        """One image's bytes -> its decoded thermal frame, or a 400 naming the row and the problem."""
        try:
            frame = decode_image(data, f"row {row}", self.limits.max_pixels)
        except BadImage as error:  # empty, truncated, not an image, 2 or 4 channels
            raise bad_request(str(error)) from None
        channels = 1 if frame.ndim == 2 else frame.shape[2]
        if channels != self.in_channels:
            raise bad_request(
                f"row {row}: thermal image has {channels} channel(s); this model takes "
                f"{self.in_channels} ({'grey' if self.in_channels == 1 else 'RGB'})"
            )
        return frame

    def translate(self, frame: np.ndarray, where: str, work: Work | None = None) -> np.ndarray:
        """A decoded thermal frame -> uint8 visible frame of its height x width (`frames.translate_frame`);
        a frame that does not fit the model's normalisation is a 400 naming `where`. `work` is checked before
        each call of the network."""

        def generate(batch: np.ndarray) -> np.ndarray:
            if work is not None:
                work.check(where)
            return run_onnx(self.session, batch, self.limits.max_run_seconds)

        try:
            visible = translate_frame(generate, frame, self.preprocess)
        except RunTimeLimit as error:  # the model's fault, not the frame's: the caller stops rather than go on
            raise RunTimeLimit(f"{self.onnx}: {error} (serve.max_run_seconds)") from None
        except PipelineError as error:
            raise bad_request(f"{where}: {error}") from None
        return quantise(visible[:, :, 0] if visible.shape[2] == 1 else visible, np.uint8)

    def translate_rows(self, images: list[bytes], arrived: float) -> list[str]:
        """Checked images -> base64 PNGs, within the request's budget (`Work`)."""
        work = Work(self.limits.max_request_cpu_seconds, arrived)
        # Every row is decoded and checked before any is translated: one bad image fails the request, naming it.
        frames = []
        for row, data in enumerate(images):
            work.check(f"row {row}")
            frames.append(self.frame(data, row))
        del images
        encoded = []
        for row, frame in enumerate(frames):
            encoded.append(to_base64(png_bytes(self.translate(frame, f"row {row}", work))))
            work.check(f"row {row}")
        return encoded

    def _translate(self, values: list[object], arrived: float) -> list[str]:
        rows = self.limits.max_rows
        if rows is not None and len(values) > rows:
            raise bad_request(f"{len(values)} images in one request; serve.max_rows allows {rows}")
        images = [row_bytes(value, row, self.limits.max_pixels) for row, value in enumerate(values)]
        self.check_request(images)
        with self.one_at_a_time:
            return self.translate_rows(images, arrived)

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        # MLflow has enforced the signature by now: whatever the request form, a DataFrame with an `image` column.
        arrived = time.monotonic()
        if len(model_input) == 0:
            raise bad_request(f"no images: the '{IMAGE}' column has 0 rows")
        try:
            return pd.DataFrame({IMAGE: self._translate(list(model_input[IMAGE]), arrived)})
        except (MlflowException, MemoryError):  # MemoryError: the process's memory limit, its owner's to answer
            raise
        except RunTimeLimit as error:  # the model's fault: MLflow would answer any other type with its traceback
            raise ServingError(str(error), error_code=TEMPORARILY_UNAVAILABLE) from None
        except Exception as error:  # a bug here, not a bad request: 500, traceback in the log only
            log.exception("translation failed")
            raise ServingError(
                f"internal error while translating: {type(error).__name__}", error_code=INTERNAL_ERROR
            ) from None
