"""The run fingerprint (training/fingerprint.py): it changes with what defines the weights and nothing else."""

import copy
import dataclasses


from thermal2visible.config.schema import SECTIONS
from thermal2visible.config.stored import marked
from thermal2visible.training.fingerprint import run_fingerprint
from thermal2visible.training import precision as precision_module
from tests.support.shipped import SHIPPED


def changed(config, key: str):
    """`config` with another value of `key`, unvalidated (the fingerprint hashes values; it does not validate them).
    train.accelerator goes from auto to cpu: the same device on this machine, so the same precision for `auto`;
    train.threads from a thread per core to a count that follows the load."""
    value = getattr(config, key)
    other = (
        {"accelerator": "cpu", "threads": "auto"}[key]
        if key in ("accelerator", "threads")
        else {
            bool: lambda: not value,
            int: lambda: value + 1,
            float: lambda: value + 0.5,
            tuple: lambda: (*value, 0),
            str: lambda: value + "-changed",
            dict: lambda: value | {"changed": 1},
        }[type(value)]()
    )
    config = copy.copy(config)
    object.__setattr__(config, key, other)
    return config


def test_run_fingerprint_changes_with_what_defines_the_weights_and_nothing_else():
    base = SHIPPED
    same = run_fingerprint(base, "data-md5")
    for section, defines in ((section, marked(section, "weights")) for section in SECTIONS):
        for key, weights in defines.items():
            other = copy.copy(base)
            object.__setattr__(other, section, changed(getattr(base, section), key))
            assert (run_fingerprint(other, "data-md5") != same) == weights, key
    assert run_fingerprint(base, "other-data") != same and run_fingerprint(base, "data-md5", "recognizer") != same


def test_run_fingerprint_hashes_what_precision_auto_means_on_the_machine(monkeypatch):
    auto = SHIPPED  # train.precision: auto on this CPU
    fingerprints = {}
    for native_bf16, resolved in ((True, "bf16-mixed"), (False, "32-true")):
        monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: native_bf16)
        named = dataclasses.replace(auto, train=dataclasses.replace(auto.train, precision=resolved))
        fingerprints[resolved] = run_fingerprint(auto, "data-md5")
        assert fingerprints[resolved] == run_fingerprint(named, "data-md5"), resolved
    # a checkpoint of an `auto` run carried from a bf16 machine to an AVX2 one does not continue there
    assert fingerprints["bf16-mixed"] != fingerprints["32-true"]
