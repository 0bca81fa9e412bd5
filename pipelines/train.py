"""Stage `train`: Pix2Pix on data/cache with PSNR early stopping, resumable, tracked in MLflow.

Writes models/generator.pt (the generator of the best smoothed-PSNR epoch, stamped with the run's fingerprint),
metrics/train.json (the stopping decision), metrics/psnr.csv, reports/psnr_curve.png: a pure function of code,
params, data and the machine's kind, so a rerun reproduces them byte for byte. The MLflow run id and wall-clock
seconds go to MLflow only (the run is found by its `generator_sha256` tag: tracking.publish). Resume state stays in
checkpoints/ (last.ckpt + best_generator.pt), which is no DVC output: it never travels through a DVC remote, and
a teammate's `dvc pull` leaves nothing to retrain. models/generator.pt is written only when training ends normally.
Under DDP (train.devices x train.num_nodes > 1) every process runs this script; only rank 0 writes files or logs.
"""

# first, before torch loads OpenMP: it sets OpenMP's spin for trainings that share the cores
import thermal2visible.training.openmp_spin  # noqa: F401

from lightning.pytorch import seed_everything

from thermal2visible.cli import run_stage
from thermal2visible.config.schema import Params
from thermal2visible.data.datamodule import PairedDataModule
from thermal2visible.errors import PipelineError
from thermal2visible.models.networks import check_networks
from thermal2visible.models.payloads import load_recognizer
from thermal2visible.paths import CACHE, CHECKPOINTS, MANIFEST, RECOGNIZER
from thermal2visible.tracking.digests import data_hash
from thermal2visible.training.precision import run_device
from thermal2visible.training.fingerprint import run_fingerprint
from thermal2visible.training.resume import one_training_at_a_time
from thermal2visible.training.run import TrainingRun
from thermal2visible.training.trainer import per_process_batch, refuse_unworkable


def main(params: Params) -> None:
    t = params.train
    check_networks(params.model, params.preprocess.image_size)  # refused by name before any data is read
    if not (CACHE / MANIFEST).is_file():
        raise PipelineError(f"{CACHE / MANIFEST}: missing; run the preprocess stage first (dvc repro preprocess)")
    seed_everything(t.seed, workers=True, verbose=False)
    data = PairedDataModule(CACHE, per_process_batch(t), params.loader)
    refuse_unworkable(params, data.manifest)
    # the frozen recognizer of the identity loss, read only when that loss is on
    recognizer, recognizer_hash = load_recognizer(RECOGNIZER, data.identities) if t.lambda_id else (None, None)
    cache_hash = data_hash(CACHE)
    device = run_device(t)
    fingerprint = run_fingerprint(params, cache_hash, recognizer_hash, device)
    with one_training_at_a_time(CHECKPOINTS, fingerprint):
        run = TrainingRun.start(params, device, fingerprint)
        fitted = run.fit(data, recognizer, cache_hash)
        if fitted is not None:  # rank 0
            run.keep(fitted)


if __name__ == "__main__":
    run_stage(main, __doc__)
