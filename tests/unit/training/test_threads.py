"""A training's threads follow the cores other processes leave free (train.threads: auto), from /proc's counts."""

import dataclasses
import os
import signal
import subprocess
import sys
from types import SimpleNamespace

import mlflow
import pytest
import torch
from lightning.pytorch.loggers import MLFlowLogger

from thermal2visible.data.datamodule import PairedDataModule
from thermal2visible.models.networks import build_networks
from thermal2visible.training import threads
from thermal2visible.training.module import Pix2Pix
from thermal2visible.training.trainer import build_trainer
from thermal2visible.cpu_limits import usable_cores


def test_the_count_moves_only_when_the_free_cores_are_far_from_it():
    assert threads.chosen(2, 1.0, 2) == 1  # a busy process on one core of two
    assert threads.chosen(2, 1.5, 2) == 2  # half a core: within the hysteresis, no flapping
    assert threads.chosen(1, 1.5, 2) == 1
    assert threads.chosen(1, 1.9, 2) == 2  # it went away
    assert threads.chosen(2, -0.5, 2) == 1  # others want more than every core: still one thread
    assert threads.chosen(8, 5.2, 8) == 5


def test_busy_time_counts_the_cores_this_process_may_use_and_nothing_idle(tmp_path):
    stat = tmp_path / "stat"
    #                  user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text(
        "cpu  300 0 30 900 9 3 3 0 0 0\n"
        "cpu0 100 0 10 300 3 1 1 7 5 0\n"
        "cpu1 200 0 20 600 6 2 2 0 0 0\n"
        "cpu12 1000 0 0 0 0 0 0 0 0 0\n"
        "intr 12345 0 0\n"
    )
    assert threads.busy_ticks({0, 1}, stat) == 112 + 224  # idle, iowait and steal are not work; guest is in user
    assert threads.busy_ticks({1}, stat) == 224
    own = tmp_path / "self-stat"
    own.write_text("4242 (python (x) y) R 1 4242 4242 0 -1 4194304 10 0 0 0 70 30 5 5 20 0 3 0 1 0 0")
    assert threads.own_ticks(own) == 100  # utime + stime; reaped children's time is theirs, not this process's


class Decisions(threads.FreeCoreThreads):
    """The callback with a window of `others` cores busy beside it, in place of /proc's counts."""

    def __init__(self, usable: int, setting: str = "auto"):
        super().__init__(setting)
        self.usable, self.changes, self.adapts, self.watches = usable, 0, setting == "auto", True

    def after_window(self, others: float) -> int:
        """A window's decision where the step hooks would take one: only while the callback watches."""
        ticks = int(others * threads.WINDOW_S * threads.TICKS_PER_S)
        self.window = {"seconds": threads.WINDOW_S, "busy": 1000 + ticks, "own": 1000}
        if self.watches:
            self.decide(SimpleNamespace(global_step=10, loggers=[]))
        return torch.get_num_threads()


def test_a_busy_neighbour_takes_a_thread_until_it_leaves_and_the_count_stays_in_between(capsys):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        callback = Decisions(usable=2)
        assert [callback.after_window(others) for others in (0.05, 1.0, 1.0, 0.5, 0.1, 0.55)] == [2, 1, 1, 1, 2, 2]
        assert callback.changes == 2
        assert "1 thread(s) from step 10: other processes kept 1.0 of 2 cores busy" in capsys.readouterr().out
    finally:
        torch.set_num_threads(before)


def test_a_thread_per_core_keeps_its_count_beside_a_busy_neighbour_and_says_once_what_auto_would_do(capsys):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        callback = Decisions(usable=2, setting="cores")
        assert [callback.after_window(others) for others in (0.05, 1.0, 1.0, 0.1, 1.2)] == [2, 2, 2, 2, 2]
        assert callback.changes == 0
        said = capsys.readouterr().out
        assert said.count("train.threads: auto follows the free cores") == 1
        assert "other processes kept 1.0 of 2 cores busy" in said
        assert "this run's 2 threads ran 100% of that time" in said  # the window's own time, at most all of it
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow  # a real busy process
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: there is no count to choose")
def test_beside_a_busy_process_of_another_session_a_run_trains_on_fewer_threads_and_says_so(
    tmp_path, monkeypatch, tiny_cache, tiny_params
):
    """A pure-Python loop in its own session, as an IDE's indexer or a build would be: the run's count drops below
    its cores, shows in its tags, and the process gets its own count back after the run. More load elsewhere on the
    machine can only lower the count further, so the test holds on a busy machine."""
    monkeypatch.setattr(threads, "WINDOW_S", 0.3)
    train = dataclasses.replace(tiny_params.train, max_epochs=4, min_epochs=1, accelerator="cpu", threads="auto")
    data = PairedDataModule(tiny_cache, train.batch_size, tiny_params.loader)
    module = Pix2Pix(*build_networks(tiny_params.model, data.manifest["image_size"], 1, 3), train)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = MLFlowLogger("threads", tracking_uri=store)
    before = torch.get_num_threads()
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        build_trainer(train, logger=logger, limit_val_batches=0).fit(module, datamodule=data)
    finally:
        os.kill(busy.pid, signal.SIGKILL)
        busy.wait()
    tags = mlflow.MlflowClient(store).get_run(logger.run_id).data.tags
    assert int(tags["threads"]) < min(before, len(os.sched_getaffinity(0))) and int(tags["thread_changes"]) >= 1
    assert torch.get_num_threads() == before


@pytest.mark.slow  # a real busy process
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: there is no count to choose")
def test_beside_a_busy_process_a_run_on_a_thread_per_core_keeps_its_count_and_says_so_once(
    monkeypatch, capsys, tiny_cache, tiny_params
):
    """The same real neighbour under `cores`: the count stays a thread per core all run long (its weights are an
    idle run's), and the log says once that `auto` would follow the free cores."""
    monkeypatch.setattr(threads, "WINDOW_S", 0.3)
    train = dataclasses.replace(tiny_params.train, max_epochs=4, min_epochs=1, accelerator="cpu", threads="cores")
    data = PairedDataModule(tiny_cache, train.batch_size, tiny_params.loader)
    module = Pix2Pix(*build_networks(tiny_params.model, data.manifest["image_size"], 1, 3), train)
    counts = []
    module.on_train_batch_end = lambda *arguments: counts.append(torch.get_num_threads())
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        build_trainer(train, logger=False, limit_val_batches=0).fit(module, datamodule=data)
    finally:
        os.kill(busy.pid, signal.SIGKILL)
        busy.wait()
    assert counts and set(counts) == {usable_cores()}
    assert capsys.readouterr().out.count("train.threads: auto follows the free cores") == 1
