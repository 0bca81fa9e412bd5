"""register: the MLflow store holds what DVC's record says, and models/generator.onnx is a version of the
dataset's registered model.

DVC runs this stage every time (`always_changed`): its effect lives in the store the user points at, which DVC
cannot see. It adds only what is missing, each found by the content it describes (tracking.publish):
the run that trained models/generator.pt, the evaluation run of metrics/eval.json, and a version holding this
.onnx file (found by its sha256: a second run adds none). A new version's registered model is
`register.model_name` (`auto`: one per dataset, registry.gate.registered_model_name); it becomes
`champion` when the export's parity check passed and, scored on this cache's test frames at full size by the same
code (inference.frames.translate_frame), it is at least as good as the current champion scored on the same frames
(when the champion was trained on other data: on those of the frames it never trained on); otherwise `challenger`.
A model whose test PSNR is below the evaluate stage's mean-image baseline is never promoted, and an experiment of
DVC's queue (a sweep) that wins becomes `candidate` (`register.promote`, registry.gate.promotes), so the champion
stays the model the user meant. Both scores and what they were taken on go on the version as tags; its description
says what it is (data, settings, scores, lineage: registry.descriptions) and why it holds its alias. The cache
manifest is packed with the version: the record of what it trained on. What the store holds now is written to
reports/registered.json.
Tracking server: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in this folder.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from functools import partial
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from thermal2visible.cli import run_stage
from thermal2visible.errors import PipelineError
from thermal2visible.config.schema import Params
from thermal2visible.data.cache import load_manifest, raw_pairs
from thermal2visible.inference.frames import translate_frame
from thermal2visible.registry.descriptions import model_description, version_description, version_facts
from thermal2visible.registry.version_files import load_registered
from thermal2visible.frame_psnr import full_frame_psnr
from thermal2visible.registry.gate import (
    ONNX_DIGEST,
    Registered,
    current_alias,
    promotes,
    register,
    registered_model_name,
    registered_version,
)
from thermal2visible.inference.request_budget import ServedLimits
from thermal2visible.inference.serving import ThermalToVisible
from thermal2visible.inference.session import RunTimeLimit, exported_settings, onnx_session, run_onnx
from thermal2visible.stage_records import read_record
from thermal2visible.tracking.publish import ensure_evaluation_run, ensure_training_run
from thermal2visible.tracking.runs import git_tags, logging_into, start_run
from thermal2visible.tracking.digests import GENERATOR_DIGEST, data_hash, file_digest
from thermal2visible.tracking.store import store_lock, tracking_uri
from thermal2visible.paths import (
    CACHE,
    EVAL_METRICS,
    EVAL_REPORT,
    EXPORT_METRICS,
    EXPORT_REPORT,
    GENERATOR,
    MANIFEST,
    ONNX,
    REGISTERED,
    TRAIN_METRICS,
)


class CachedTestFrames:
    """The gate's `TestFrames`, read from the cache: the new version's test frames (full size, in register, as
    served) and what a registered model trained on.

    `score` runs a registered model on them through the serving code (inference.frames.translate_frame);
    `trained_on` reads the training manifest packed with a model (registry.packing.pyfunc_arguments), so the gate
    can leave out the frames a champion trained on when the data changed."""

    def __init__(self, cache: Path, experiment: str, *limits: float):
        self.scratch = tempfile.TemporaryDirectory()  # the downloaded versions, removed with this object
        self.experiment = (
            experiment  # a version from elsewhere is refused before it is scored (registry/version_files.py)
        )
        self.limits = limits  # version_files.load_registered's: max_pixels to max_check_seconds
        tests = [source for source in load_manifest(cache)["sources"] if source["split"] == "test"]
        if not tests:
            raise PipelineError(f"{cache}: the test split is empty; the champion gate needs test frames")
        self.frames = list(zip((frame_hashes(source) for source in tests), raw_pairs(cache, "test")))
        self.models: dict[str, ThermalToVisible] = {}

    def _model(self, model_uri: str) -> ThermalToVisible:
        if model_uri not in self.models:
            try:  # as data: the version's ONNX file and manifest, run by the installed code (none of its own)
                scratch = Path(self.scratch.name) / str(len(self.models))
                self.models[model_uri] = load_registered(model_uri, self.experiment, scratch, *self.limits)
            except RunTimeLimit as error:  # a graph that loops, stopped on its first run: refused before any move
                raise PipelineError(f"{error}; refused, nothing was moved") from None
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
        run = partial(run_onnx, model.session, seconds=model.limits.max_run_seconds)
        translate = partial(translate_frame, run, settings=model.preprocess)
        try:
            return full_frame_psnr(translate, pairs), len(pairs)
        except RunTimeLimit as error:  # a graph that loops is refused by name before any alias moves
            raise PipelineError(f"{model_uri}: {error}; refused, nothing was moved") from None


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
    exported = read_record(EXPORT_METRICS, EXPORT_REPORT)
    generator = file_digest(GENERATOR)
    if exported.get(GENERATOR_DIGEST) != generator:
        raise PipelineError(f"{ONNX}: exported from another generator than {GENERATOR} (run the export stage)")
    evaluated = read_record(EVAL_METRICS, EVAL_REPORT)
    test_psnr = evaluated.get("generator", {}).get("psnr")
    if type(test_psnr) not in (int, float):
        raise PipelineError(f"{EVAL_METRICS}: no number at generator.psnr (the evaluate stage writes it)")
    name = registered_model_name(params)
    mlflow.set_tracking_uri(tracking_uri())
    training_run = ensure_training_run(params, generator)
    evaluation_run = ensure_evaluation_run(params, generator, training_run)
    onnx_digest = file_digest(ONNX)
    client = MlflowClient()
    with store_lock(tracking_uri()):  # another experiment's register stage waits: one gate at a time
        existing = registered_version(client, name, onnx_digest)
        if existing is None:
            result = register_new(params, name, exported, evaluated, training_run, evaluation_run, onnx_digest)
            version, alias, gate = result.version, result.alias, result.gate
        else:
            gate = {key.removeprefix("gate_"): value for key, value in existing.tags.items() if key.startswith("gate_")}
            version = int(existing.version)
            alias = current_alias(client, name, existing.version)
            print(f"register: {ONNX} is {name} version {version} already (@{alias}); nothing added")
    summary = {"model_name": name, "version": version, "alias": alias, "test_psnr": test_psnr, "gate": gate}
    REGISTERED.parent.mkdir(parents=True, exist_ok=True)
    REGISTERED.write_text(json.dumps(summary, indent=2) + "\n")


def register_new(
    params: Params,
    name: str,
    exported: dict,
    evaluated: dict,
    training_run: str,
    evaluation_run: str,
    onnx_digest: str,
) -> Registered:
    settings = exported_settings(onnx_session(ONNX), str(ONNX))
    git = git_tags()
    test_psnr = evaluated["generator"]["psnr"]
    baseline = evaluated.get("baseline_mean_image", {}).get("psnr")
    facts = version_facts(params, load_manifest(CACHE)["sources"], read_record(TRAIN_METRICS), evaluated)
    lineage = {
        "training_run_id": training_run,
        "evaluation_run_id": evaluation_run,
        "fingerprint": settings.fingerprint,
        "data_hash": settings.data_hash,
        ONNX_DIGEST: onnx_digest,
        GENERATOR_DIGEST: exported[GENERATOR_DIGEST],
        "git_commit": git.get("mlflow.source.git.commit"),
        "git_dirty": git.get("git_dirty"),
        "dvc_experiment": os.environ.get("DVC_EXP_NAME"),
        "data": facts["data"],
        "settings": facts["settings"],
    }
    with logging_into(start_run(params, "register", sections=()).run_id):
        result = register(
            ONNX,
            name=name,
            test_psnr=test_psnr,
            parity_passed=exported.get("parity_max_abs_error", float("nan")) <= params.export.atol,
            metrics={key: float(value) for key, value in exported.items() if type(value) in (int, float)},
            lineage=lineage,
            limits=ServedLimits.of(params.serve),
            training_manifest=trained_manifest(CACHE, settings.data_hash),
            frames=CachedTestFrames(
                CACHE,
                params.mlflow.experiment,
                params.serve.max_pixels,
                params.serve.max_model_pixels,
                params.serve.max_run_seconds,
                params.serve.max_check_seconds,
            ),
            baseline_psnr=baseline if type(baseline) in (int, float) else None,
            baseline_margin=params.register.baseline_margin,
            promote=promotes(params),
            description=version_description(facts, lineage),
            model_description=model_description(params),
        )
    print(f"registered {result.name} version {result.version} as @{result.alias} ({result.compared})")
    for why in result.held_back:
        print(f"register: version {result.version} is not @champion: {why}")
    return result


if __name__ == "__main__":
    run_stage(main, description=__doc__.splitlines()[0])
