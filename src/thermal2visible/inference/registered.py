"""A registered model as data: its ONNX file and training manifest, run by the installed code.

A version in the registry also carries code (its models-from-code file and the packed package), which
`mlflow models serve` runs: whoever can write the registry decides that code. The project's own clients
(pipelines/translate.py, the register stage's champion gate) never run it: they download the version, read only the
files its MLmodel names as the pyfunc's artifacts, each checked to lie inside the download, and build the installed
`ThermalToVisible` around them, whose ONNX metadata is validated on load like any file's.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import mlflow.artifacts
import yaml
from mlflow.pyfunc import PythonModelContext

from thermal2visible.errors import PipelineError
from thermal2visible.inference.serving import TRAINING_MANIFEST, ServedLimits, ThermalToVisible

ARTIFACTS = ("onnx", TRAINING_MANIFEST)  # what a registered version holds as data; anything else it names is ignored


def model_of_files(
    artifacts: dict[str, str], max_pixels: int, max_model_pixels: int, max_run_seconds: float
) -> ThermalToVisible:
    """The installed serving code around local files: {"onnx": path[, "training_manifest": path]}."""
    model = ThermalToVisible()
    # no request budget: one local image at a time
    config = asdict(ServedLimits(max_pixels, max_model_pixels, max_run_seconds=max_run_seconds))
    model.load_context(PythonModelContext(artifacts=artifacts, model_config=config))
    return model


def artifact_files(model_dir: Path, where: str) -> dict[str, str]:
    """The pyfunc artifacts an MLmodel names, as paths inside `model_dir`; a PipelineError naming `where` when the
    file is not an MLflow pyfunc of this project or a path points outside the download."""
    try:
        flavor = yaml.safe_load((model_dir / "MLmodel").read_text())["flavors"]["python_function"]
        named = {name: flavor["artifacts"][name]["path"] for name in ARTIFACTS if name in flavor["artifacts"]}
    except (OSError, yaml.YAMLError, KeyError, TypeError) as error:
        raise PipelineError(f"{where}: not a model this project registered ({type(error).__name__}: {error})") from None
    if "onnx" not in named:
        raise PipelineError(f"{where}: its MLmodel names no ONNX generator")
    files = {}
    root = model_dir.resolve()
    for name, relative in named.items():
        path = (root / str(relative)).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            raise PipelineError(f"{where}: its artifact {name} ({relative!r}) is not a file inside the model")
        files[name] = str(path)
    return files


def load_registered(
    model_uri: str, scratch: Path, max_pixels: int, max_model_pixels: int, max_run_seconds: float
) -> ThermalToVisible:
    """The model at `model_uri` (models:/NAME@ALIAS, models:/NAME/VERSION, runs:/..., a local model folder),
    downloaded into `scratch` and run by the installed code; none of the version's own code runs. A model the
    tracking URI cannot reach raises MLflow's exception (its message may name that URI: the caller words it)."""
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(scratch)))
    try:
        return model_of_files(artifact_files(local, model_uri), max_pixels, max_model_pixels, max_run_seconds)
    except PipelineError as error:  # it names a file of the download, a temporary folder: the version comes first
        raise type(error)(f"{model_uri}: {error}") from None
