"""register: models/generator.onnx -> a new version of `register.model_name` in the MLflow registry.

The version becomes `champion` when the export's parity check passed and, scored on this cache's test frames
at full size by the same code (inference.frames.translate_frame), it is at least as good as the current champion
scored on the same frames (when the champion was trained on other data: on those of the frames it never trained on);
otherwise `challenger`. Both scores and what they were taken on go on the version as tags and into
metrics/register.json. The cache manifest is packed with the version: the record of what it trained on.
Tracking server: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in this folder.
"""

from __future__ import annotations

import json
import math
from functools import partial
from pathlib import Path

import mlflow
import mlflow.pyfunc
from mlflow.exceptions import MlflowException

from thermal2visible.cli import run_stage
from thermal2visible.errors import PipelineError
from thermal2visible.config import Params
from thermal2visible.data.cache import load_manifest, raw_pairs
from thermal2visible.inference.frames import translate_frame
from thermal2visible.metrics import full_frame_psnr
from thermal2visible.inference.registry import register
from thermal2visible.inference.serving import ThermalToVisible
from thermal2visible.inference.session import onnx_metadata, onnx_session, run_onnx
from thermal2visible.tracking.store import data_hash, git_tags, tracking_uri, training_run_id
from thermal2visible.paths import CACHE, ONNX, EVAL_METRICS, EXPORT_METRICS, REGISTER_METRICS, MANIFEST


def read_metrics(path: Path, stage: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"{path}: missing (run the {stage} stage first)") from None
    except json.JSONDecodeError as error:
        raise PipelineError(f"{path}: not valid JSON ({error})") from None


class TestFrames:
    """The new version's test frames (full size, in register, as served) and what a registered model trained on.

    `score` runs a registered model on them through the serving code (inference.frames.translate_frame);
    `trained_on` reads the training manifest packed with a model (inference.serving.pyfunc_arguments), so the gate
    can leave out the frames a champion trained on when the data changed."""

    def __init__(self, cache: Path):
        tests = [source for source in load_manifest(cache)["sources"] if source["split"] == "test"]
        if not tests:
            raise PipelineError(f"{cache}: the test split is empty; the champion gate needs test frames")
        self.frames = list(zip((frame_hashes(source) for source in tests), raw_pairs(cache, "test")))
        self.models: dict[str, ThermalToVisible] = {}

    def _model(self, model_uri: str) -> ThermalToVisible:
        if model_uri not in self.models:
            try:
                self.models[model_uri] = mlflow.pyfunc.load_model(model_uri).unwrap_python_model()
            except MlflowException:  # e.g. files behind a tracking server, asked for straight from its database
                # (MLflow's own message names the tracking URI, which may hold a database password: not repeated)
                raise PipelineError(
                    f"{model_uri}: its files cannot be read through MLFLOW_TRACKING_URI, so the "
                    "gate cannot score it on the new test frames; register through the tracking "
                    "server that stores them (nothing was moved)"
                ) from None
        return self.models[model_uri]

    def trained_on(self, model_uri: str) -> frozenset[str] | None:
        """sha256 of every frame the model trained or was validated on; None for a model packed without them."""
        manifest = self._model(model_uri).training_manifest
        if manifest is None:
            return None
        sources = json.loads(Path(manifest).read_text())["sources"]
        return frozenset(digest for source in sources if source["split"] != "test" for digest in frame_hashes(source))

    def score(self, model_uri: str, leave_out: frozenset[str] = frozenset()) -> tuple[float, int]:
        """(full-frame PSNR, frames scored) on the test frames none of whose files are in `leave_out`."""
        pairs = [pair for hashes, pair in self.frames if not hashes & leave_out]
        if not pairs:
            return math.nan, 0
        model = self._model(model_uri)
        translate = partial(translate_frame, partial(run_onnx, model.session), cfg=model.preprocess)
        return full_frame_psnr(translate, pairs), len(pairs)


def frame_hashes(source: dict) -> frozenset[str]:
    """A manifest source's file hashes: its thermal and its visible frame (one file for side_by_side)."""
    return frozenset(source["sha256"].values())


def trained_manifest(cache: Path, data_hash_of_model: str | None) -> Path:
    """The cache's manifest, packed with the model as the record of what it trained on, after checking that the
    model was trained on this cache (a cache changed since training would record the wrong frames)."""
    if data_hash_of_model != data_hash(cache):
        raise PipelineError(
            f"{ONNX}: trained on data {data_hash_of_model}, but {cache} is now "
            f"{data_hash(cache)}: re-run train and export (dvc repro) before registering"
        )
    return cache / MANIFEST


def main(params: Params) -> None:
    if not ONNX.is_file():
        raise PipelineError(f"{ONNX}: no exported model (run the export stage first)")
    exported = read_metrics(EXPORT_METRICS, "export")
    test_psnr = read_metrics(EVAL_METRICS, "evaluate").get("generator", {}).get("psnr")
    if type(test_psnr) not in (int, float):
        raise PipelineError(f"{EVAL_METRICS}: no number at generator.psnr (the evaluate stage writes it)")
    metadata = onnx_metadata(onnx_session(ONNX))
    git = git_tags()
    parity_error = exported.get("parity_max_abs_error", float("nan"))
    mlflow.set_tracking_uri(tracking_uri())
    result = register(
        ONNX,
        name=params.register.model_name,
        experiment=params.mlflow.experiment,
        test_psnr=test_psnr,
        parity_passed=parity_error <= params.export.atol,
        metrics={key: float(value) for key, value in exported.items() if type(value) in (int, float)},
        lineage={
            "training_run_id": training_run_id(metadata.get("fingerprint")),
            "fingerprint": metadata.get("fingerprint"),
            "data_hash": metadata.get("data_hash"),
            "git_commit": git.get("mlflow.source.git.commit"),
            "git_dirty": git.get("git_dirty"),
        },
        max_pixels=params.serve.max_pixels,
        max_model_pixels=params.serve.max_model_pixels,
        training_manifest=trained_manifest(CACHE, metadata.get("data_hash")),
        frames=TestFrames(CACHE),
    )
    summary = {
        "model_name": result.name,
        "version": result.version,
        "alias": result.alias,
        "test_psnr": test_psnr,
        "champion_psnr_before": result.champion_psnr_before,
        "gate": result.gate,
    }
    REGISTER_METRICS.parent.mkdir(parents=True, exist_ok=True)
    REGISTER_METRICS.write_text(json.dumps(summary, indent=2) + "\n")
    gate = result.gate
    compared = (
        f"full-frame test PSNR {gate['new_psnr']:.2f} dB against champion version {gate['champion_version']}"
        f"'s {gate['champion_psnr']:.2f} dB on {gate['frames']} frames: {gate['basis']}"
        if "new_psnr" in gate
        else gate["basis"]
    )
    print(f"registered {result.name} version {result.version} as @{result.alias} ({compared})")


if __name__ == "__main__":
    run_stage(main, description=__doc__.splitlines()[0])
