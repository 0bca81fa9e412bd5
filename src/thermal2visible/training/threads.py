"""A training's intra-op threads: a thread per usable core (train.threads: cores), a fixed count (N), or the cores that
other processes leave free (auto).

torch's CPU thread pool (OpenMP) splits every operation among its threads and waits for all of them. A thread whose
core another process is busy on gets part of that core's time only, and every operation waits for it: beside one
busy process a training can take many times its time alone, where losing one core of two should cost at most x2.
With one thread fewer the run computes on the cores that are free.

`cores` keeps a thread per usable core, as before. `auto` starts so and, while a single-process CPU run steps, it
counts the CPU time that every other process spends on the cores it may use:
/proc/stat's busy time of those cores less this process's own (/proc/self/stat), over its steps only. A training that
takes turns with this one (shared_cores.TakeTurns) waits while this one steps, so it does not count. Every WINDOW_S
seconds of steps the free cores decide the count; it moves only when they are HYSTERESIS or more away from it, so a
neighbour near half a core does not make it flap. DDP processes keep their share of the cores (GanDDPStrategy).

The count shows in the epoch line (progress.EpochLine), each change in a line of its own and in the run's tags
`threads` (the count in use) and `thread_changes`; under `cores` a run says once when other processes keep cores
busy, and that `auto` would follow them. Threads round otherwise: a reduction split over two threads adds
in another order than over one (docs/training.md#threads), so a count that changes mid-run trains weights that differ
from an idle run's at rounding level: `cores` (the default) and `N` give the same weights whatever else runs.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback
from lightning.pytorch.loggers import MLFlowLogger

from thermal2visible.cpu_limits import usable_cores

WINDOW_S = 2.0  # seconds of steps per decision: /proc counts in ticks of 10 ms, so this is +-0.1 core
HYSTERESIS = 0.6  # cores between the free cores and the count in use before the count moves
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
BUSY_TAG = "busy_machine"  # the run's tag holding the notice that other processes kept its cores busy


def threads_per_process(setting: int | str, accelerator: str, processes: int) -> int | str | None:
    """The intra-op threads each of a run's `processes` (on one machine) computes with for `setting`: N as given,
    a thread per usable core for one process, an equal share of them for several (GanDDPStrategy); "auto" where the
    count follows the load; None off the CPU, where the kernels' arithmetic does not depend on it."""
    if accelerator != "cpu":
        return None
    if isinstance(setting, int):
        return setting
    if processes > 1:
        return max(1, usable_cores() // processes)
    # torch's pool starts at the cores of the affinity (or OMP_NUM_THREADS); a cgroup quota may allow less
    return "auto" if setting == "auto" else min(torch.get_num_threads(), usable_cores())


def busy_ticks(cores: set[int], stat: Path = Path("/proc/stat")) -> int:
    """Clock ticks `cores` have spent working since boot (user, nice, system, irq, softirq; guest time is in user)."""
    total = 0
    for line in stat.read_text().splitlines():
        name, *counts = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            user, nice, system, _idle, _iowait, irq, softirq = (int(count) for count in counts[:7])
            total += user + nice + system + irq + softirq
    return total


def own_ticks(stat: Path = Path("/proc/self/stat")) -> int:
    """Clock ticks this process (all its threads) has used since it started."""
    utime, stime = stat.read_text().rsplit(")", 1)[1].split()[11:13]
    return int(utime) + int(stime)


def chosen(threads: int, free: float, usable: int) -> int:
    """The thread count for `free` cores (less than 0 when others want more than all): `threads` unless the free
    cores are HYSTERESIS or more away from it."""
    if abs(free - threads) < HYSTERESIS:
        return threads
    return min(usable, max(1, round(free)))


def set_tags(trainer, tags: dict[str, str]) -> None:
    for logger in trainer.loggers:
        if isinstance(logger, MLFlowLogger) and logger.run_id:
            for key, value in tags.items():
                logger.experiment.set_tag(logger.run_id, key, value)


class FreeCoreThreads(Callback):
    """Sets the intra-op threads from train.threads at setup, gives the process back its count at teardown, and
    under `auto` in a single-process CPU run re-counts them every WINDOW_S seconds of steps. Registered after
    TakeTurns, so a step's count starts once this run holds the turn."""

    def __init__(self, setting: int | str):
        self.setting = setting

    def setup(self, trainer, module, stage: str) -> None:
        self.before, self.changes = torch.get_num_threads(), 0
        self.cores = os.sched_getaffinity(0)
        self.usable = threads_per_process("cores", "cpu", 1)
        on_own_cpu = trainer.world_size == 1 and trainer.strategy.root_device.type == "cpu"
        if isinstance(self.setting, int):
            torch.set_num_threads(self.setting)
        elif on_own_cpu:
            torch.set_num_threads(self.usable)
        self.adapts = self.setting == "auto" and on_own_cpu and self.usable > 1
        # under `cores` the same reading only tells the user, once, what auto would do, and then stops
        self.watches = self.setting in ("auto", "cores") and on_own_cpu and self.usable > 1
        self.window = {"seconds": 0.0, "busy": 0, "own": 0}
        set_tags(trainer, {"threads": str(torch.get_num_threads()), "thread_changes": "0"})

    def reading(self) -> tuple[float, int, int]:
        return time.perf_counter(), busy_ticks(self.cores), own_ticks()

    def on_train_batch_start(self, *hook_arguments) -> None:
        if self.watches:
            self.started = self.reading()

    def on_train_batch_end(self, trainer, *hook_arguments) -> None:
        if not self.watches:
            return
        for key, now, then in zip(("seconds", "busy", "own"), self.reading(), self.started):
            self.window[key] += now - then
        if self.window["seconds"] >= WINDOW_S:
            self.decide(trainer)

    def decide(self, trainer) -> None:
        window, threads = self.window, torch.get_num_threads()
        others = max(0, window["busy"] - window["own"]) / (window["seconds"] * TICKS_PER_S)
        self.window = {"seconds": 0.0, "busy": 0, "own": 0}
        count = chosen(threads, self.usable - others, self.usable)
        if count == threads:
            return
        if not self.adapts:
            self.watches = False
            # what the run's threads got of the time: each step waits for the slowest of them
            ran = min(1.0, window["own"] / (window["seconds"] * TICKS_PER_S * threads))
            notice = (
                f"other processes kept {others:.1f} of {self.usable} cores busy during the last "
                f"{window['seconds']:.1f} s of steps, and this run's {threads} threads ran {ran:.0%} of that time: "
                "with a thread per core (train.threads: cores) every step waits for the threads that share a core "
                "with them, so this training takes several times as long as on an idle machine; train.threads: "
                "auto follows the free cores (its weights then differ from an idle run's at rounding level)"
            )
            print(f"training: {notice}", flush=True)
            set_tags(trainer, {BUSY_TAG: notice})  # for the run's record, and for make demo's closing lines
            return
        torch.set_num_threads(count)
        self.changes += 1
        print(
            f"training: {count} thread(s) from step {trainer.global_step}: other processes kept {others:.1f} of "
            f"{self.usable} cores busy during the last {window['seconds']:.1f} s of steps",
            flush=True,
        )
        set_tags(trainer, {"threads": str(count), "thread_changes": str(self.changes)})

    def teardown(self, trainer, module, stage: str) -> None:
        torch.set_num_threads(self.before)  # the process's other Trainers and work start from its own count
