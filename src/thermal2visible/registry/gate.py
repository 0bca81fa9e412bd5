"""Each exported model becomes a new version of one registered model; a gate decides who is `champion`.

The gate compares like with like: before `champion` moves, the current champion is scored on the *new* version's
test frames by the same code (`TestFrames`, full-frame PSNR in register.py), beside the new version itself, and
the new version wins when its ONNX export passed the parity check and it scores at least as well. When the two
were trained on different data (their `data_hash` tags differ) only the test frames the champion never trained on
count (see `_compare`). Both numbers, the frames they were taken on, the champion's version and whether the data
differed go on the new version as tags. Without test frames at hand the stored `test_psnr` tags are compared,
and the version's `gate_basis` tag says so. A version that loses is the `challenger`, and so is one whose test PSNR is
below the mean-image baseline's (the training faces' mean, whatever the input): it learnt nothing from the thermal
frame. A winner that may not be promoted (`promotes`: an experiment of a sweep) is the `candidate`, so a sweep never
takes `champion` from the model the user meant. Versions are never overwritten, so a rejected model stays inspectable
and servable. A model that fails on its own input example (a frame of the kind it was trained on) is never
registered: MLflow itself only logs a warning.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import mlflow
import pandas as pd
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.models import convert_input_example_to_serving_input, validate_serving_input

from thermal2visible.config.schema import Params
from thermal2visible.errors import PipelineError
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.registry.packing import pyfunc_arguments
from thermal2visible import paths

CHAMPION = "champion"
CHALLENGER = "challenger"
CANDIDATE = "candidate"
PSNR_TAG = "test_psnr"
SAME_TEST_SET = "same test set, same code"
UNSEEN_TEST_FRAMES = "the new test frames the champion never trained on, same code"
NO_UNSEEN_FRAMES = (
    "not compared: the champion trained on every new test frame (other data); it stays champion, "
    "promote by hand if this version is better"
)
CHAMPION_FRAMES_UNKNOWN = (
    "not compared: the champion was trained on other data and does not record which frames "
    "(registered before that was packed with it); it stays champion, promote by hand"
)
STORED_TAGS = "stored test_psnr tags (test sets may differ)"
ONNX_DIGEST = "onnx_sha256"  # a version is found by its file: registering the same file again adds no version
AUTO = "auto"


def registered_model_name(params: Params) -> str:
    """register.model_name, or for `auto` one registered model per dataset: the experiment's name and the data's
    (the built-in scene, or the folder of your own data), e.g. `thermal2visible-portrait`. A model of other data
    so never replaces a champion it was not trained for."""
    if params.register.model_name != AUTO:
        return params.register.model_name
    source = Path(params.data.source)
    dataset = params.synthesize.scene if source == paths.RAW else source.resolve().name
    return f"{params.mlflow.experiment}-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", dataset)


def promotes(params: Params) -> bool:
    """register.promote; `auto`: everywhere but in an experiment of DVC's queue. Such an experiment is what a sweep
    is made of, and its stages run in DVC's copy of the project, away from DVC_ROOT (the project itself); a `dvc repro`
    or `dvc exp run` in the workspace runs where DVC_ROOT points."""
    if params.register.promote != AUTO:
        return params.register.promote
    root = os.environ.get("DVC_ROOT")
    return root is None or Path(root).resolve() == Path.cwd().resolve()


def registered_version(client: MlflowClient, name: str, onnx_digest: str) -> ModelVersion | None:
    """The version of `name` holding the ONNX file whose sha256 is `onnx_digest`, if one was registered."""
    try:
        client.get_registered_model(name)
    except MlflowException as error:
        if error.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    versions = client.search_model_versions(f"name = '{name}' and tags.{ONNX_DIGEST} = '{onnx_digest}'")
    return min(versions, key=lambda version: int(version.version), default=None)


def current_alias(client: MlflowClient, name: str, version: str) -> str:
    """The alias `version` of `name` holds now (the champion may have moved since it was gated)."""
    aliases = client.get_registered_model(name).aliases
    return next((alias for alias, number in aliases.items() if str(number) == str(version)), "none")


@dataclass(frozen=True)
class Registered:
    name: str
    version: int
    alias: str
    champion_psnr_before: float | None
    gate: dict[str, object]  # what the gate compared: basis, both scores, champion version, data_hash_differs
    compared: str = ""  # `outcome`: what the gate compared, in words
    held_back: tuple[str, ...] = ()  # `outcome`: what kept it from champion besides the comparison


def ensure_registered_model(client: MlflowClient, name: str, description: str = "") -> None:
    """Create registered model `name` unless it exists; another run creating it at the same moment is no error.
    `description` goes on it where it has none (a description someone wrote in the UI stays)."""
    try:
        client.create_registered_model(name, description=description or None)
    except MlflowException as error:
        if error.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
        if description and not client.get_registered_model(name).description:
            client.update_registered_model(name, description=description)


def champion_psnr(client: MlflowClient, name: str) -> float | None:
    """The stored test PSNR of the current champion, or None when there is no champion yet."""
    aliases = client.get_registered_model(name).aliases
    if CHAMPION not in aliases:
        return None
    return float(client.get_model_version(name, aliases[CHAMPION]).tags.get(PSNR_TAG, "-inf"))


def gate(
    test_psnr: float,
    parity_passed: bool,
    current_champion_psnr: float | None,
    above_baseline: bool = True,
    promote: bool = True,
) -> str:
    """`champion` for a parity-checked model at least as good as the champion and the mean-image baseline, or
    `candidate` where such a model may not be promoted; else `challenger`."""
    beats_champion = current_champion_psnr is None or test_psnr >= current_champion_psnr
    if not (parity_passed and above_baseline and beats_champion):
        return CHALLENGER
    return CHAMPION if promote else CANDIDATE


def outcome(alias: str, record: dict[str, object], test_psnr: float, parity_passed: bool) -> tuple[str, list[str]]:
    """(what the gate compared, what kept the version from `champion` besides the comparison), in words."""
    if "frames" in record:
        compared = (
            f"full-frame test PSNR {record['new_psnr']:.2f} dB against champion version {record['champion_version']}"
            f"'s {record['champion_psnr']:.2f} dB on {record['frames']} frames: {record['basis']}"
        )
    else:
        compared = str(record["basis"])
    held_back = [] if parity_passed else ["its ONNX export failed the parity check (export.atol)"]
    baseline, margin = record.get("baseline_psnr"), float(record.get("baseline_margin", 0.0))
    if baseline is not None and test_psnr < baseline + margin:
        held_back += [
            f"its test PSNR {test_psnr:.2f} dB is below the mean-image baseline's {baseline:.2f} dB (the training "
            "faces' mean image, whatever the input)"
            + (f" plus register.baseline_margin {margin:+.2f} dB" if margin else "")
            + ": train longer, or check that the data's pairs match"
        ]
    if alias == CANDIDATE:
        held_back += [
            "it won the gate, but register.promote is off here (auto turns it off in an experiment of DVC's queue, "
            "a sweep); to serve it, move @champion to it by hand (docs/serving.md)"
        ]
    return compared, held_back


class TestFrames(Protocol):
    """The new version's test frames, as the gate scores models on them (pipelines/register.py)."""

    def score(self, model_uri: str, leave_out: frozenset[str] = frozenset()) -> tuple[float, int]:
        """(PSNR, frames scored) of a registered model on the test frames whose files are not in `leave_out`."""

    def trained_on(self, model_uri: str) -> frozenset[str] | None:
        """The file hashes a registered model trained and validated on; None where it does not record them."""


def _compare(
    client: MlflowClient, name: str, version: str, test_psnr: float, data_hash: str | None, frames: TestFrames | None
) -> tuple[float | None, dict[str, object]]:
    """(champion's score to beat, the gate record) for the new `version` of `name`.

    Same data: both are scored on all the new test frames. Other data: those frames may be ones the champion
    trained on, which would flatter it, so both are scored only on the frames it never saw (its packed training
    manifest says which); where none are left, or the champion does not say what it trained on, they are not
    compared and the champion stays (score to beat: infinity), the record saying why."""
    aliases = client.get_registered_model(name).aliases
    if CHAMPION not in aliases:
        return None, {"basis": "no champion yet"}
    champion = client.get_model_version(name, aliases[CHAMPION])
    differs = champion.tags.get("data_hash") != data_hash
    record: dict[str, object] = {"champion_version": int(champion.version), "data_hash_differs": differs}
    if frames is None:
        before = float(champion.tags.get(PSNR_TAG, "-inf"))
        return before, record | {"basis": STORED_TAGS, "new_psnr": test_psnr, "champion_psnr": before}
    new_uri, champion_uri = f"models:/{name}/{version}", f"models:/{name}/{champion.version}"
    if not differs:
        (new, count), (old, _) = frames.score(new_uri), frames.score(champion_uri)
        return old, record | {"basis": SAME_TEST_SET, "new_psnr": new, "champion_psnr": old, "frames": count}
    seen = frames.trained_on(champion_uri)
    if seen is None:
        return math.inf, record | {"basis": CHAMPION_FRAMES_UNKNOWN}
    (new, count), (old, _) = frames.score(new_uri, seen), frames.score(champion_uri, seen)
    if count == 0:
        return math.inf, record | {"basis": NO_UNSEEN_FRAMES}
    return old, record | {"basis": UNSEEN_TEST_FRAMES, "new_psnr": new, "champion_psnr": old, "frames": count}


def check_example_predicts(model_uri: str, example: pd.DataFrame, onnx_path: str | Path) -> None:
    """Run the logged model on its own input example as the scoring server would (JSON in, `predict`); a
    PipelineError naming the .onnx and the model's answer when it fails."""
    try:
        with warnings.catch_warnings():
            # deprecated for mlflow.models.predict, a runner that manages environments; with mlflow pinned, this
            # in-process check stays and its warning tells a user nothing they can act on
            warnings.filterwarnings("ignore", "``mlflow.models.utils.validate_serving_input`` is deprecated")
            validate_serving_input(model_uri, convert_input_example_to_serving_input(example))
    except MlflowException as error:
        raise PipelineError(
            f"{onnx_path}: the packed model fails on its own input example, a frame of the kind it "
            f"was trained on ({error.message}); nothing was registered"
        ) from None


def register(
    onnx_path: str | Path,
    *,
    name: str,
    test_psnr: float,
    parity_passed: bool,
    metrics: dict[str, float],
    lineage: dict[str, str | None],
    limits: ServedLimits,
    training_manifest: str | Path | None,
    frames: TestFrames | None = None,
    baseline_psnr: float | None = None,
    baseline_margin: float = 0.0,
    promote: bool = True,
    description: str = "",
    model_description: str = "",
) -> Registered:
    """Log the .onnx as a pyfunc in the active run (the `register` run, which the caller started through
    tracking.store and made active), add it as a new version of `name`, gate it, set its alias.

    `metrics` go on the run; `lineage` (training run id, data hash, ...; None values skipped), the test PSNR, the
    parity result and the gate record go on the version as tags. `training_manifest` (the cache manifest the model
    trained on) is packed with it; `frames` scores registered versions on the new version's test frames, and the
    champion's and the new version's scores decide the gate. A `test_psnr` below `baseline_psnr` (the evaluate
    stage's mean-image baseline, on the same images) plus `baseline_margin` is never promoted, nor is any version
    where `promote` is off.
    `description` (what the version is: data, settings, scores, lineage) goes on the version followed by the gate's
    `outcome`; `model_description` on the registered model where it has none.
    """
    client = MlflowClient()
    tags = {key: str(value) for key, value in lineage.items() if value is not None}
    tags |= {PSNR_TAG: repr(float(test_psnr)), "parity_passed": str(parity_passed).lower()}
    run_id = mlflow.active_run().info.run_id
    mlflow.set_tags(tags)
    mlflow.log_metrics({PSNR_TAG: test_psnr, **metrics})
    with pyfunc_arguments(onnx_path, limits, training_manifest) as arguments:
        logged = mlflow.pyfunc.log_model(name="model", **arguments)
    check_example_predicts(logged.model_uri, arguments["input_example"], onnx_path)
    ensure_registered_model(client, name, model_description)
    # The version's run is the training run that made the weights: the run page lists the version, and the
    # version page links back to that run (the register run only packed them).
    version = client.create_model_version(
        name,
        logged.model_uri,
        run_id=lineage.get("training_run_id") or run_id,
        tags=tags,
        model_id=logged.model_id,
    )
    before = champion_psnr(client, name)
    to_beat, record = _compare(client, name, version.version, test_psnr, lineage.get("data_hash"), frames)
    if baseline_psnr is not None:
        record |= {"baseline_psnr": float(baseline_psnr), "baseline_margin": float(baseline_margin)}
    above_baseline = baseline_psnr is None or test_psnr >= baseline_psnr + baseline_margin
    alias = gate(record.get("new_psnr", test_psnr), parity_passed, to_beat, above_baseline, promote)
    for key, value in record.items():
        client.set_model_version_tag(
            name, version.version, f"gate_{key}", str(value).lower() if isinstance(value, bool) else str(value)
        )
    client.set_registered_model_alias(name, alias, version.version)
    compared, held_back = outcome(alias, record, test_psnr, parity_passed)
    gated = f"**Registered as** `@{alias}`: {compared}" + "".join(f"; not promoted: {why}" for why in held_back)
    client.update_model_version(name, version.version, description=f"{description}\n\n{gated}.".strip())
    return Registered(name, int(version.version), alias, before, record, compared, tuple(held_back))
