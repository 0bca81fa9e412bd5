"""Trainings on one machine take turns for its cores: a training step waits while another run holds them."""

import dataclasses
import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lightning.pytorch import Callback

from thermal2visible.data.datamodule import PairedDataModule
from thermal2visible.training.module import Pix2Pix
from thermal2visible.models.networks import build_networks
from thermal2visible.training.shared_cores import TURNS
from thermal2visible.training.trainer import build_trainer


class StepEnds(Callback):
    def __init__(self):
        self.times = []

    def on_train_batch_end(self, *hook_arguments) -> None:
        self.times.append(time.monotonic())


def test_a_training_step_waits_while_another_run_holds_the_cores(tiny_cache, tiny_params):
    held, released = threading.Event(), []

    def neighbour() -> None:
        """Another run's step: holds the turn for two seconds."""
        with TURNS.open("a") as turns:
            fcntl.flock(turns, fcntl.LOCK_EX)
            held.set()
            time.sleep(2)
            released.append(time.monotonic())

    other = threading.Thread(target=neighbour)
    other.start()
    held.wait()
    train = dataclasses.replace(tiny_params.train, max_epochs=1, min_epochs=1, accelerator="cpu")
    data = PairedDataModule(tiny_cache, train.batch_size, tiny_params.loader)
    module = Pix2Pix(*build_networks(tiny_params.model, data.manifest["image_size"], 1, 3), train)
    steps = StepEnds()
    build_trainer(train, callbacks=[steps], limit_val_batches=0).fit(module, datamodule=data)
    other.join()
    assert steps.times and steps.times[0] > released[0]  # no step ran while the neighbour held the cores
    assert len(steps.times) == len(data.train_dataloader())  # and every step ran once it let go


@pytest.mark.slow  # Python processes started through a shell
def test_a_cgroup_cpu_quota_caps_the_cores_a_process_uses(tmp_path):
    """A real cgroup (v1's cpu controller, or v2) limited to half a CPU: a process inside it may use one core."""
    for folder, limit in (
        (Path("/sys/fs/cgroup/cpu"), {"cpu.cfs_quota_us": "50000", "cpu.cfs_period_us": "100000"}),
        (Path("/sys/fs/cgroup"), {"cpu.max": "50000 100000"}),
    ):
        group = folder / f"t2v-test-{os.getpid()}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            for name, value in limit.items():
                (group / name).write_text(value)
            probe = "from thermal2visible.cpu_limits import *; print(cpu_quota(), usable_cores())"
            command = f'echo $$ > {group / "cgroup.procs"} && exec {sys.executable} -c "{probe}"'
            answer = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
        finally:
            group.rmdir()
        assert answer.split() == ["0.5", "1"]
        return
    pytest.skip("no cgroup can be made here (needs root and a writable cpu controller)")


TAKES_TURNS = """
import sys
from types import SimpleNamespace
if sys.argv[1] == "torch first":
    import torch  # noqa: F401
from thermal2visible.training import shared_cores
callback = shared_cores.TakeTurns()
callback.files = {}
device = SimpleNamespace(type="cpu")
callback.setup(SimpleNamespace(world_size=1, strategy=SimpleNamespace(root_device=device)), None, "fit")
print("spin in time:", shared_cores.openmp_spin.IN_TIME)
"""


@pytest.mark.slow  # a fresh interpreter each
@pytest.mark.parametrize("order", ["turns first", "torch first"])
def test_a_process_that_loaded_torch_before_the_spin_was_set_says_so_when_it_takes_turns(order, tmp_path):
    """OpenMP reads GOMP_SPINCOUNT when torch loads it: a process that imports torch before training/openmp_spin.py
    (which shared_cores.py imports first) trains with the long spin, and says so; one that imports shared_cores.py
    first says nothing."""
    environment = {key: value for key, value in os.environ.items() if key != "GOMP_SPINCOUNT"}
    environment["XDG_RUNTIME_DIR"] = str(tmp_path)  # its own turns file
    said = subprocess.run(
        [sys.executable, "-c", TAKES_TURNS, order], env=environment, capture_output=True, text=True, check=True
    ).stdout
    late = order == "torch first"
    assert f"spin in time: {not late}" in said
    assert ("torch was imported before thermal2visible.training.openmp_spin" in said) is late
