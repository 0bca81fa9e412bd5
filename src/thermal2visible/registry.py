"""Each exported model becomes a new version of one registered model; a gate decides who is `champion`.

The alias `champion` moves to the new version only when its ONNX export passed the parity check and its test
PSNR is at least the current champion's (kept as the version tag `test_psnr`); otherwise the new version is
the `challenger`. Versions are never overwritten, so a rejected model stays inspectable and servable.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from thermal2visible.serving import pyfunc_arguments

CHAMPION = "champion"
CHALLENGER = "challenger"
PSNR_TAG = "test_psnr"


@dataclass(frozen=True)
class Registered:
    name: str
    version: int
    alias: str
    champion_psnr_before: float | None


def ensure_registered_model(client: MlflowClient, name: str) -> None:
    """Create registered model `name` unless it exists; another run creating it at the same moment is no error."""
    try:
        client.create_registered_model(name)
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


def champion_psnr(client: MlflowClient, name: str) -> float | None:
    """The test PSNR of the current champion, or None when there is no champion yet."""
    aliases = client.get_registered_model(name).aliases
    if CHAMPION not in aliases:
        return None
    return float(client.get_model_version(name, aliases[CHAMPION]).tags.get(PSNR_TAG, "-inf"))


def gate(test_psnr: float, parity_passed: bool, current_champion_psnr: float | None) -> str:
    """`champion` for a parity-checked model at least as good as the champion, else `challenger`."""
    beats_champion = current_champion_psnr is None or test_psnr >= current_champion_psnr
    return CHAMPION if parity_passed and beats_champion else CHALLENGER


def register(onnx_path: str | Path, *, name: str, experiment: str, test_psnr: float, parity_passed: bool,
             metrics: dict[str, float], lineage: dict[str, str | None], max_pixels: int) -> Registered:
    """Log the .onnx as a pyfunc in a `register` run, add it as a new version of `name`, set its alias.

    `metrics` go on the run; `lineage` (training run id, data hash, ...; None values skipped), the test PSNR and
    the parity result go on the version as tags, so the gate and a reader of the registry see them.
    """
    client = MlflowClient()
    tags = {key: str(value) for key, value in lineage.items() if value is not None}
    tags |= {PSNR_TAG: repr(float(test_psnr)), "parity_passed": str(parity_passed).lower()}
    mlflow.set_experiment(experiment)
    with mlflow.start_run(run_name="register") as run:
        mlflow.set_tags(tags)
        mlflow.log_metrics({PSNR_TAG: test_psnr, **metrics})
        logged = mlflow.pyfunc.log_model(name="model", **pyfunc_arguments(onnx_path, max_pixels))
    ensure_registered_model(client, name)
    # The version's run is the training run that made the weights: the run page lists the version, and the
    # version page links back to that run (the register run only packed them).
    version = client.create_model_version(name, logged.model_uri, run_id=lineage.get("training_run_id") or
                                          run.info.run_id, tags=tags, model_id=logged.model_id)
    before = champion_psnr(client, name)
    alias = gate(test_psnr, parity_passed, before)
    client.set_registered_model_alias(name, alias, version.version)
    return Registered(name, int(version.version), alias, before)
