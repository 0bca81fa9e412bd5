"""A run's fingerprint: the hash of everything that defines its trained weights, stamped on every checkpoint, so a
checkpoint continues only the run that would have made the same weights (training.resume). In: the keys config/schema.py
marks `defines_weights()`, what `auto` and `cores` resolve to on this machine (precision, layout, thread count,
kernels), the cache, the recognizer and the code that makes the weights with the libraries it imports. Out: the keys
marked `stops_training()`, and code and libraries that only track, draw or word what happens."""

from __future__ import annotations

import hashlib
import inspect
import json
import re
from functools import cache
from pathlib import Path

from thermal2visible.config.schema import Params
from thermal2visible.config.stored import weight_defining
from thermal2visible.imports import PACKAGE, code_digest
from thermal2visible.paths import PIPELINES
from thermal2visible.training.precision import RunDevice, kernels, run_device
from thermal2visible.training.threads import threads_per_process

FINGERPRINT = re.compile(r"[0-9a-f]{16}")  # what run_fingerprint returns, and so the only name a parked folder has
TRAINING_SCRIPT = PACKAGE.parents[1] / PIPELINES / "train.py"  # in the project the package belongs to


@cache
def training_code() -> str:
    """The digest of the code that makes the weights: the train stage's script itself (not what it imports), and
    the import closures of what it fits (the LightningModule, its networks, the data module, the Trainer) and of
    the early stopping that picks the kept epoch. Tracking, figures, progress lines, records and messages are left
    out, and so are the libraries only they import: rewording a message or upgrading MLflow continues a run."""
    # here, not at the top: the training modules import this one
    from thermal2visible.data.datamodule import PairedDataModule
    from thermal2visible.models.networks import build_networks
    from thermal2visible.training.early_stopping import PsnrEarlyStopping
    from thermal2visible.training.module import Pix2Pix
    from thermal2visible.training.trainer import build_trainer

    fitted = (Pix2Pix, build_networks, PairedDataModule, build_trainer, PsnrEarlyStopping)
    return code_digest([TRAINING_SCRIPT], [Path(inspect.getsourcefile(part)) for part in fitted])


def run_fingerprint(
    params: Params, data_hash: str, recognizer_hash: str | None = None, device: RunDevice | None = None
) -> str:
    """Hash of what defines the trained weights: a checkpoint continues only a run with the same fingerprint.
    `device`: the run's resolved one (by default `run_device(params.train)`)."""
    t, device = params.train, device or run_device(params.train)
    defining = {
        section: {key: getattr(getattr(params, section), key) for key in keys}
        for section, keys in weight_defining().items()
    }
    # What `auto` and `cores` mean on this machine, not the words: a checkpoint carried to a machine (or a container,
    # a taskset, an OMP_NUM_THREADS) where they mean another precision, layout or thread count, or whose kernels
    # round otherwise, starts afresh.
    defining["train"] |= {
        "precision": device.precision,
        "channels_last": device.channels_last,
        "threads": threads_per_process(t.threads, device.accelerator, t.devices),
        "kernels": kernels(device.accelerator),
        # the cap stops a run (StopRule) and shapes the weights only through the learning rate's decay, which ends there
        "lr_decay_ends": t.max_epochs if t.lr_decay_epochs else None,
    }
    defining |= {"data": data_hash, "recognizer": recognizer_hash, "code": training_code()}
    return hashlib.sha256(json.dumps(defining, sort_keys=True).encode()).hexdigest()[:16]
