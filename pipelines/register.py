"""register: models/generator.onnx -> a new version of `register.model_name` in the MLflow registry.

The version becomes `champion` when the export's parity check passed and, scored on this cache's test frames
at full size by the same code (frames.translate_frame), it is at least as good as the current champion scored
on the same frames; otherwise `challenger`. Both scores, and whether the champion was trained on other data,
go on the version as tags and into metrics/register.json. Tracking server: MLFLOW_TRACKING_URI, else
sqlite:///mlflow.db in this folder.
"""
from __future__ import annotations

import json
from pathlib import Path

import mlflow
import mlflow.pyfunc
from mlflow.exceptions import MlflowException

from thermal2visible.cli import run_stage
from thermal2visible.errors import PipelineError
from thermal2visible.config import Params
from thermal2visible.data.cache import raw_pairs
from thermal2visible.export import run_onnx
from thermal2visible.frames import full_frame_psnr
from thermal2visible.registry import register
from thermal2visible.serving import onnx_metadata, onnx_session
from thermal2visible.tracking.store import git_tags, tracking_uri, training_run_id
from thermal2visible.paths import CACHE, ONNX, EVAL_METRICS, EXPORT_METRICS, REGISTER_METRICS



def read_metrics(path: Path, stage: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"{path}: missing (run the {stage} stage first)") from None
    except json.JSONDecodeError as error:
        raise PipelineError(f"{path}: not valid JSON ({error})") from None


def test_set_scorer(cache: Path):
    """score(model_uri) -> full-frame PSNR of that registered model on `cache`'s test frames, this code."""
    pairs = list(raw_pairs(cache, "test"))
    if not pairs:
        raise PipelineError(f"{cache}: the test split is empty; the champion gate needs test frames")

    def score(model_uri: str) -> float:
        try:
            model = mlflow.pyfunc.load_model(model_uri).unwrap_python_model()
        except MlflowException:  # e.g. files behind a tracking server, asked for straight from its database
            # (MLflow's own message names the tracking URI, which may hold a database password: not repeated here)
            raise PipelineError(f"{model_uri}: its files cannot be read through MLFLOW_TRACKING_URI, so the gate "
                                "cannot score it on the new test frames; register through the tracking server that "
                                "stores them (nothing was moved)") from None
        return full_frame_psnr(lambda batch: run_onnx(model.session, batch), model.preprocess, pairs)
    return score


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
        ONNX, name=params.register.model_name, experiment=params.mlflow.experiment,
        test_psnr=test_psnr, parity_passed=parity_error <= params.export.atol,
        metrics={key: float(value) for key, value in exported.items() if type(value) in (int, float)},
        lineage={"training_run_id": training_run_id(metadata.get("fingerprint")),
                 "fingerprint": metadata.get("fingerprint"), "data_hash": metadata.get("data_hash"),
                 "git_commit": git.get("mlflow.source.git.commit"), "git_dirty": git.get("git_dirty")},
        max_pixels=params.serve.max_pixels, max_model_pixels=params.serve.max_model_pixels,
        score=test_set_scorer(CACHE))
    summary = {"model_name": result.name, "version": result.version, "alias": result.alias,
               "test_psnr": test_psnr, "champion_psnr_before": result.champion_psnr_before, "gate": result.gate}
    REGISTER_METRICS.parent.mkdir(parents=True, exist_ok=True)
    REGISTER_METRICS.write_text(json.dumps(summary, indent=2) + "\n")
    compared = (f" (full-frame test PSNR {result.gate['new_psnr']:.2f} dB against champion version "
                f"{result.gate['champion_version']}'s {result.gate['champion_psnr']:.2f} dB on the same frames"
                + ("; the champion was trained on other data" if result.gate["data_hash_differs"] else "") + ")"
                if "new_psnr" in result.gate else "")
    print(f"registered {result.name} version {result.version} as @{result.alias}{compared}")


if __name__ == "__main__":
    run_stage(main, description=__doc__.splitlines()[0])
