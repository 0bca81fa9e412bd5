"""Trainings that share a machine's cores take turns, one step at a time.

torch's CPU thread pool (OpenMP) splits every operation among its threads and waits for all of them. Two trainings
with a thread per core each put two threads on every core: each operation then waits for a thread the kernel has
lent to the other run, and both slow about x4 instead of x2 (x13 with OpenMP's passive wait). Fewer threads per run
would end that but change the weights: a reduction over one thread rounds otherwise than over two, so the same
params would train another model beside a neighbour. So the project's runs keep their threads and take turns: each
training and validation step holds one lock per user and machine, the steps of two runs alternate at full speed,
and the rest of their work (loading, logging, other stages) overlaps. Other programs take no turns: the threads
follow the cores they leave free (threads.FreeCoreThreads). OpenMP's idle spin is shortened first (openmp_spin.py), so a
thread that finished its share of a step does not hold its core into the other run's turn.
"""

from thermal2visible.training import openmp_spin  # noqa: I001 (first: before Lightning loads torch)

import fcntl
import os
import tempfile
from pathlib import Path

from lightning.pytorch import Callback


# Per user, in the user's own runtime folder where there is one: a lock file another user owns could be held by
# them to stall every training of this user, so one that is not this user's is not used.
TURNS = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / f"thermal2visible-{os.getuid()}-cores.lock"


def own_turns_file():
    """TURNS opened for locking, or None (with a line saying why) when another user owns it."""
    turns = TURNS.open("a")
    if os.fstat(turns.fileno()).st_uid != os.getuid():
        turns.close()
        print(f"training: {TURNS} belongs to another user; this run does not take turns for the cores")
        return None
    return turns


class TakeTurns(Callback):
    """Holds TURNS for every training and validation step of a single-process CPU run. A DDP job's processes
    already split the cores among themselves, and a lock between them would deadlock their gradient exchange.
    Every Trainer of a process shares one open file of TURNS: a lock is held per open file, so a step that raised
    before giving its turn back can never block the next Trainer of the same process."""

    files: dict[int, object] = {}  # process id -> its open TURNS, or None (a forked child opens its own)

    def __init__(self):
        self.turns = None

    def setup(self, trainer, module, stage: str) -> None:
        if trainer.world_size == 1 and trainer.strategy.root_device.type == "cpu":
            if os.getpid() not in self.files:
                self.files[os.getpid()] = own_turns_file()
                if not openmp_spin.IN_TIME:
                    print(
                        f"training: torch was imported before {openmp_spin.__name__}, so OpenMP keeps its long idle "
                        "spin and a training beside this one slows more than it need; import it first, or set "
                        "GOMP_SPINCOUNT=10000 in the environment"
                    )
            self.turns = self.files[os.getpid()]

    def take(self, *hook_arguments, **hook_keywords) -> None:
        if self.turns is not None:
            fcntl.flock(self.turns, fcntl.LOCK_EX)

    def give(self, *hook_arguments, **hook_keywords) -> None:
        if self.turns is not None:
            fcntl.flock(self.turns, fcntl.LOCK_UN)

    on_train_batch_start = on_validation_batch_start = take
    on_train_batch_end = on_validation_batch_end = on_exception = teardown = give
