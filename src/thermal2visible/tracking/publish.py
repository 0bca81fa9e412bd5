"""The MLflow runs that DVC's record stands for, found by what they describe and logged from the record where missing.

DVC skips a stage whose outputs it already holds: in a fresh clone whose outputs came out byte-identical, after
`dvc pull`, on a second `dvc repro`, or with MLFLOW_TRACKING_URI switched to a team server. A run logged as that
stage's side effect would then be missing from the store the user points at. So each run is found by the content it
describes — the sha256 of models/generator.pt for the training run, and of metrics/eval.json too for the evaluation
run — and, where the store has none, logged from the record itself (params, the metric files, the figures, the model),
tagged `logged_from: dvc record`. The register stage, which DVC always runs, calls these before it registers.
"""

from __future__ import annotations

import csv

from thermal2visible.config.schema import Params
from thermal2visible.errors import PipelineError
from thermal2visible import paths
from thermal2visible.stage_records import read_record
from thermal2visible.tracking.runs import log_artifact, newest_run, start_run
from thermal2visible.tracking.digests import GENERATOR_DIGEST, file_digest
from thermal2visible.tracking.store import open_store, tracking_uri

EVALUATION_DIGEST = "eval_sha256"
LOGGED_FROM_RECORD = {"logged_from": "dvc record"}
TRAINING_SECTIONS = ("preprocess", "loader", "model", "train", "early_stop")  # the params a train run logs
FINGERPRINT_TAG = "fingerprint"  # what a training of the same weights' inputs (training.resume) continues


def log_training_record(logger) -> None:
    """What a training run holds of the train stage's record, whether the training logs it or it is logged from DVC's
    record: the generator's sha256 (what the register stage finds the run by: the weights it wrote, not its settings,
    since a torchrun job and a DVC run of the same params.yaml write different weights under one fingerprint), the
    generator, the PSNR curve and table, metrics/train.json."""
    if not logger.run_id:  # None on ranks other than 0
        return
    logger.experiment.set_tag(logger.run_id, GENERATOR_DIGEST, file_digest(paths.GENERATOR))
    for path in (paths.GENERATOR, paths.PSNR_CURVE, paths.PSNR_CSV, paths.TRAIN_METRICS):
        log_artifact(logger, path)


def ensure_training_run(params: Params, digest: str) -> str:
    """The id of the run that trained models/generator.pt (sha256 `digest`); logged from metrics/train.json,
    metrics/psnr.csv and the PSNR curve when this store has none (the training ran against another store, or before
    a `dvc pull`)."""
    found = newest_run(open_store(tracking_uri()), "train", {GENERATOR_DIGEST: digest}, "FINISHED")
    if found:
        return found
    # torch, for the payload, only here: the register stage, which DVC runs every time, finds the run without it
    from thermal2visible.models.payloads import load_generator

    fingerprint = load_generator(paths.GENERATOR)[1]["fingerprint"]  # metrics/train.json holds numbers only
    logger = start_run(
        params,
        "train",
        TRAINING_SECTIONS,
        dataset_context="training",
        tags={FINGERPRINT_TAG: str(fingerprint), **LOGGED_FROM_RECORD},
    )
    with paths.PSNR_CSV.open(newline="") as file:
        for row in csv.DictReader(file):
            curve = {f"val_{name}": float(row[name]) for name in ("psnr", "psnr_smoothed") if row[name]}
            logger.log_metrics(curve, step=int(row["epoch"]))
    log_training_record(logger)
    logger.finalize("success")
    print(f"register: logged the training run of {paths.GENERATOR} from DVC's record ({logger.run_id})")
    return logger.run_id


def evaluation_metrics(report: dict) -> dict[str, float]:
    """eval.json's scores as flat MLflow metrics: test_* for the generator, <baseline>_* beside them, identity_*."""
    metrics = {
        f"test_{metric}" if name == "generator" else f"{name}_{metric}": value
        for name, values in report.items()
        if isinstance(values, dict) and name != "identity"
        for metric, value in values.items()
    }
    identity = report.get("identity", {})
    if identity.get("score"):
        metrics |= {
            f"identity_{identity['score']}_{name}": value for name, value in identity.items() if type(value) is float
        }
    return metrics


def ensure_evaluation_run(params: Params, generator: str, training_run_id: str) -> str:
    """The id of the run that holds metrics/eval.json's scores of models/generator.pt (sha256 `generator`); logged
    when missing."""
    report = read_record(paths.EVAL_METRICS, paths.EVAL_REPORT)
    if report.get(GENERATOR_DIGEST) != generator:
        raise PipelineError(
            f"{paths.EVAL_REPORT}: scores another generator than {paths.GENERATOR} (run the evaluate stage: dvc repro)"
        )
    tags = {GENERATOR_DIGEST: generator, EVALUATION_DIGEST: file_digest(paths.EVAL_METRICS)}
    found = newest_run(open_store(tracking_uri()), "evaluate", tags, "FINISHED")
    if found:
        return found
    logger = start_run(
        params, "evaluate", ("mlflow",), dataset_context="evaluation", tags=tags | {"train_run_id": training_run_id}
    )
    logger.log_metrics(evaluation_metrics(report))
    for path in (paths.EVAL_METRICS, paths.EVAL_REPORT, paths.EVAL_GRID, paths.ALIGN_REPORT, paths.ALIGN_OVERLAY):
        if path.is_file():  # the alignment report is absent beside a cache made by hand, outside preprocess
            log_artifact(logger, path)
    logger.finalize("success")
    return logger.run_id
