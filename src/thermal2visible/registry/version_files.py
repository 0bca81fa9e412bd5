"""A registered model as data: its ONNX file and training manifest, run by the installed code.

A version in the registry also carries code (its models-from-code file and the packed package), which
`mlflow models serve` runs: whoever can write the registry decides that code. The project's own clients
(pipelines/translate.py, the register stage's champion gate) never run it: they download the version, read only the
files its MLmodel names as the pyfunc's artifacts, each checked to lie inside the download, and build the installed
`ThermalToVisible` around them, whose ONNX metadata is validated on load like any file's.

On a team server (an http(s) tracking URI, docs/team.md) a registered model's name proves nothing: any user may
create a name nobody created yet and becomes its MANAGE. What MLflow's auth does enforce is who writes into the
project's experiment: logging a run there, or artifacts under its artifact location, needs MANAGE on it. So a
registered version is trusted (`trusted_model_uri`, which `make serve`, translate.py and the register stage's gate
all call) only when its run lies in the project's experiment and its files under that experiment's artifact location.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path, PurePosixPath
from urllib.parse import urlparse

import mlflow.artifacts
import yaml
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.pyfunc import PythonModelContext

from thermal2visible.config.yaml_data import load_yaml
from thermal2visible.errors import PipelineError
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.serving import TRAINING_MANIFEST, ThermalToVisible

ARTIFACTS = ("onnx", TRAINING_MANIFEST)  # what a registered version holds as data; anything else it names is ignored
REGISTRY_URI = re.compile(r"models:/(?P<name>[^/@]+)(?:/(?P<version>[0-9]+)|@(?P<alias>[^/@]+))")
RUN_URI = re.compile(r"runs:/(?P<run_id>[^/]+)(?:/.*)?")
RULE_RUN = "its run lies in the project's experiment"
RULE_FILES = "its files lie under the project experiment's artifact location"
RULE_KIND = "on a team server only registered versions, runs' models and local folders are loaded"


class UntrustedModel(PipelineError):
    """A model from a team server that the trust rules refuse; the message names the model and the rule."""


def on_team_server() -> bool:
    """Whether the tracking URI is a server, whose auth the trust rules rest on; a local store has no users."""
    return urlparse(mlflow.get_tracking_uri()).scheme in ("http", "https")


def lies_under(uri: str, root: str) -> bool:
    """Whether artifact URI `uri` is `root` or inside it: same scheme and host, path below root's (no `..`)."""
    location, base = urlparse(uri), urlparse(root)
    path = PurePosixPath(location.path)
    same_store = (location.scheme or "file", location.netloc) == (base.scheme or "file", base.netloc)
    return same_store and ".." not in path.parts and not location.query and path.is_relative_to(base.path or "/")


def version_refusal(client: MlflowClient, version: ModelVersion, experiment: str) -> str | None:
    """The trust rule `version` breaks, as "refused by the rule '...': why"; None for a trusted version."""
    project = client.get_experiment_by_name(experiment)
    if project is None:
        return f"refused by the rule '{RULE_RUN}': the server has no experiment {experiment}"
    if not version.run_id:
        return f"refused by the rule '{RULE_RUN}' ({experiment}): it names no run"
    try:
        run_experiment = client.get_run(version.run_id).info.experiment_id
    except MlflowException as error:  # a run the user may not read, or a deleted one, is no run of the project
        if error.get_http_status_code() not in (403, 404):
            raise
        run_experiment = "one this login cannot read"
    if run_experiment != project.experiment_id:
        return (
            f"refused by the rule '{RULE_RUN}' ({experiment}, id {project.experiment_id}): "
            f"its run {version.run_id} is in experiment {run_experiment}"
        )
    files = client.get_model_version_download_uri(version.name, version.version)
    if not lies_under(files, project.artifact_location):
        return f"refused by the rule '{RULE_FILES}' ({project.artifact_location}): its files are at {files}"
    return None


def trusted_model_uri(model_uri: str, experiment: str) -> str:
    """`model_uri` as it is loaded: on a team server, models:/NAME@ALIAS pinned to the version the alias names now
    (an alias moved between this check and the download would load an unchecked version), after checking that the
    version comes from experiment `experiment` (the module's rule); an UntrustedModel naming the model, the version
    and the rule otherwise. A local store, and a local folder, are returned as they are."""
    if not on_team_server() or urlparse(model_uri).scheme in ("", "file"):
        return model_uri
    client = MlflowClient()
    if registered := REGISTRY_URI.fullmatch(model_uri):
        name, number, alias = registered["name"], registered["version"], registered["alias"]
        version = client.get_model_version_by_alias(name, alias) if alias else client.get_model_version(name, number)
        refusal = version_refusal(client, version, experiment)
        if refusal is not None:
            raise UntrustedModel(f"{model_uri} (registered model {name} version {version.version}): {refusal}")
        return f"models:/{name}/{version.version}"
    if run := RUN_URI.fullmatch(model_uri):
        project = client.get_experiment_by_name(experiment)
        if project is None or client.get_run(run["run_id"]).info.experiment_id != project.experiment_id:
            raise UntrustedModel(f"{model_uri}: refused by the rule '{RULE_RUN}' ({experiment})")
        return model_uri
    raise UntrustedModel(f"{model_uri}: refused by the rule '{RULE_KIND}'")


def model_of_files(
    artifacts: dict[str, str], max_pixels: int, max_model_pixels: int, max_run_seconds: float, max_check_seconds: float
) -> ThermalToVisible:
    """The installed serving code around local files: {"onnx": path[, "training_manifest": path]}."""
    model = ThermalToVisible()
    # no request budget: one local image at a time
    limits = ServedLimits(
        max_pixels, max_model_pixels, max_run_seconds=max_run_seconds, max_check_seconds=max_check_seconds
    )
    config = asdict(limits)
    model.load_context(PythonModelContext(artifacts=artifacts, model_config=config))
    return model


def artifact_files(model_dir: Path, where: str) -> dict[str, str]:
    """The pyfunc artifacts an MLmodel names, as paths inside `model_dir`; a PipelineError naming `where` when the
    file is not an MLflow pyfunc of this project or a path points outside the download."""
    try:
        flavor = load_yaml((model_dir / "MLmodel").read_text())["flavors"]["python_function"]
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
    model_uri: str,
    experiment: str,
    scratch: Path,
    max_pixels: int,
    max_model_pixels: int,
    max_run_seconds: float,
    max_check_seconds: float,
) -> ThermalToVisible:
    """The model at `model_uri` (models:/NAME@ALIAS, models:/NAME/VERSION, runs:/..., a local model folder), trusted
    as coming from experiment `experiment` (`trusted_model_uri`), downloaded into `scratch` and run by the installed
    code; none of the version's own code runs. A model the tracking URI cannot reach raises MLflow's exception (its
    message may name that URI: the caller words it)."""
    pinned = trusted_model_uri(model_uri, experiment)
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=pinned, dst_path=str(scratch)))
    try:
        files = artifact_files(local, model_uri)
        return model_of_files(files, max_pixels, max_model_pixels, max_run_seconds, max_check_seconds)
    except PipelineError as error:  # it names a file of the download, a temporary folder: the version comes first
        raise type(error)(f"{model_uri}: {error}") from None
