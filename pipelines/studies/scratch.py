"""Study configurations in scratch projects (pipelines/study.py's timed studies, benchmarks/time_to_quality.py): each
a real `pipelines/train.py` run in its own scratch project, on one cache made by `pipelines/preprocess.py`, logging
to the project's MLflow store. Run from the project folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from thermal2visible.errors import PipelineError
from thermal2visible.paths import (
    CACHE,
    EVAL_METRICS,
    EVAL_REPORT,
    GENERATOR,
    INDEX,
    PIPELINES,
    RECOGNIZER,
    TRAIN_METRICS,
)
from thermal2visible.stage_records import read_record
from .runs import trained_run
from thermal2visible.tracking.digests import GENERATOR_DIGEST, file_digest
from thermal2visible.tracking.store import tracking_uri


def run_script(script: str, cwd: Path, params: Path, overrides: list[str]) -> subprocess.CompletedProcess:
    env = os.environ | {
        "MLFLOW_TRACKING_URI": tracking_uri(),
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DVC_NO_ANALYTICS": "1",
    }
    command = [sys.executable, str(PIPELINES.resolve() / script), "--params", str(params.resolve())]
    command += [arg for override in overrides for arg in ("--set", override)]
    finished = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if finished.returncode != 0:
        raise PipelineError(f"{script} {' '.join(overrides)} failed in {cwd}:\n{finished.stderr.strip()[-2000:]}")
    return finished


def base_project(work: Path) -> Path:
    """The study's own project folder: its cache and recognizer, which every child links to."""
    return work / "base"


def prepare_cache(work: Path, params: Path, overrides: list[str]) -> Path:
    """The study's cache: pipelines/preprocess.py on ./data/ingested with the study's overrides, and the recognizer
    trained on it (pipelines/train_recognizer.py), which the identity loss and the evaluate stage use."""
    ingested = INDEX
    if not ingested.is_file():
        raise PipelineError(f"{ingested}: missing; run the ingest stage first (dvc repro ingest)")
    base = base_project(work)
    (base / "data").mkdir(parents=True)
    link_source(base)
    (base / "data" / "ingested").symlink_to(ingested.parent.resolve())
    run_script("preprocess.py", base, params, overrides)
    run_script("train_recognizer.py", base, params, overrides)
    return base / CACHE


def link_source(project: Path) -> None:
    """The raw frames the ingest index names, linked into a scratch project: preprocess reads them, and evaluate
    translates them whole (psnr_full_frame)."""
    source = Path(json.loads(INDEX.read_text())["root"])
    if not source.is_absolute():
        (project / source).parent.mkdir(parents=True, exist_ok=True)
        (project / source).symlink_to(source.resolve())


def child_project(work: Path, name: str) -> Path:
    """The scratch project folder of the child run `name`."""
    return work / name.replace(" ", "_").replace("/", "-")


def train_child(work: Path, name: str, cache: Path, params: Path, overrides: list[str]) -> dict:
    """One real training run in its own scratch project; what it reports (train.json, PSNR per epoch, speed)."""
    project = child_project(work, name)
    (project / CACHE).parent.mkdir(parents=True)
    (project / CACHE).symlink_to(cache.resolve())
    link_source(project)
    (project / RECOGNIZER).parent.mkdir()
    (project / RECOGNIZER).symlink_to((base_project(work) / RECOGNIZER).resolve())
    run_script("train.py", project, params, overrides)
    trained = {GENERATOR_DIGEST: file_digest(project / GENERATOR)}  # the run that wrote this generator
    return trained_run(json.loads((project / TRAIN_METRICS).read_text()), name, overrides, trained)


def evaluate_child(work: Path, name: str, params: Path, overrides: list[str]) -> dict:
    """The evaluate stage run in the child's scratch project: its test scores and identity score (eval.json)."""
    project = child_project(work, name)
    run_script("evaluate.py", project, params, overrides)
    return read_record(project / EVAL_METRICS, project / EVAL_REPORT)
