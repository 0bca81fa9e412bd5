"""Each key of a section training reads is marked: it defines the trained weights, it only says where a run stops, or
it only says how a run is carried out. The marks are the one classing of keys: the run's fingerprint
(training.resume), DVC's params of the train stage and the upgrade of stored files (stored.py) are read from them."""

from dataclasses import field

NEVER_ABSENT = object()


def defines_weights(before: object = NEVER_ABSENT):
    """A key that defines the trained weights: it enters the run's fingerprint, so a checkpoint of a run with another
    value never continues (training.fingerprint.run_fingerprint). `before`: for a key added after runs and models were
    stored, the value they all had: a stored file lacking the key reads as having it (config.stored). (A run begun
    before the key existed starts afresh all the same: the fingerprint holds the code, and the key changed it.)"""
    return field(metadata={"weights": True, "before": before})


def stops_training(before: object = NEVER_ABSENT):
    """A key that only says where a run stops (the epoch cap, a time budget, early stopping's patience): it stays out
    of the fingerprint, so a checkpoint continues with another value where that value would not have stopped the run
    before it (training.early_stopping.StopRule); the run then ends where an uninterrupted one would. Where the cap
    shapes the learning-rate schedule, the fingerprint holds the schedule. `before`: as defines_weights'."""
    return field(metadata={"weights": False, "stops": True, "before": before})


def run_setting():
    """A key that only says how a run is carried out (device kind, speed, logging, resuming): changing it keeps
    last.ckpt, and the resumed run ends with the same weights."""
    return field(metadata={"weights": False, "before": NEVER_ABSENT})
