"""register: models/generator.onnx -> a new version of `register.model_name` in the MLflow registry.

The version becomes `champion` when the export's parity check passed and its test PSNR (metrics/eval.json)
is at least the current champion's; otherwise `challenger`. Writes metrics/register.json.
Tracking server: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in this folder.
"""
from __future__ import annotations

import json
from pathlib import Path

import mlflow

from thermal2visible.cli import run_stage
from thermal2visible.errors import PipelineError
from thermal2visible.config import Params
from thermal2visible.registry import register
from thermal2visible.serving import onnx_metadata, onnx_session
from thermal2visible.tracking.store import git_tags, tracking_uri
from thermal2visible.paths import ONNX, EVAL_METRICS, EXPORT_METRICS, REGISTER_METRICS



def read_metrics(path: Path, stage: str) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"{path}: missing (run the {stage} stage first)") from None
    except json.JSONDecodeError as error:
        raise PipelineError(f"{path}: not valid JSON ({error})") from None


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
        lineage={"training_run_id": metadata.get("training_run_id"), "data_hash": metadata.get("data_hash"),
                 "git_commit": git.get("mlflow.source.git.commit"), "git_dirty": git.get("git_dirty")},
        max_pixels=params.serve.max_pixels)
    summary = {"model_name": result.name, "version": result.version, "alias": result.alias,
               "test_psnr": test_psnr, "champion_psnr_before": result.champion_psnr_before}
    REGISTER_METRICS.parent.mkdir(parents=True, exist_ok=True)
    REGISTER_METRICS.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"registered {result.name} version {result.version} as @{result.alias}")


if __name__ == "__main__":
    run_stage(main, description=__doc__.splitlines()[0])
