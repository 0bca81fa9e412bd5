"""Worker processes whose cost the operating system bounds: `make serve` decodes and translates each request in one.

Pillow's `load()`, tifffile's decoders and an onnxruntime run are single C calls whose cost no header states (a
progressive JPEG's scans, a TIFF's tile size, a PNG's zlib stream): checks between steps cannot stop them, so the
limits hold for the process instead, whatever the format:

- memory: `RLIMIT_AS` (serve.worker_memory_mib), set in the worker before it loads anything; an allocation past it
  fails (a MemoryError, or a crash inside a C library) and the worker is replaced.
- CPU: `RLIMIT_CPU`, raised before each request to the seconds used so far plus the request's budget; past it the
  kernel ends the worker with SIGXCPU.
- wall clock: the parent waits for the answer until the request's deadline and kills the worker then (a worker may
  also be stuck without using CPU).

A worker serves one request at a time; a request waits for an idle one until its deadline. A worker that stopped over
a limit is replaced by a fresh one before the next request takes its place. The workers start from multiprocessing's
'forkserver' (the server process has threads, which `fork` would copy in whatever state they were in).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import multiprocessing.forkserver
import os
import queue
import resource
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Callable

log = logging.getLogger(__name__)

Handler = Callable[[object], object]  # one request's payload -> its answer, run in a worker
Setup = Callable[[], Handler]  # picklable: builds the handler inside the worker (loads the model)

_OK, _FAILED, _MEMORY = "ok", "failed", "memory"


class OverLimit(Exception):
    """A request stopped by a limit: `limit` names it (a params key or MLflow's setting); `busy` is true when no
    worker took it up at all."""

    def __init__(self, message: str, limit: str, busy: bool = False):
        super().__init__(message)
        self.limit = limit
        self.busy = busy


@dataclass(frozen=True)
class WorkerLimits:
    memory_mib: int  # address space of one worker (serve.worker_memory_mib)
    cpu_seconds: float | None  # CPU-seconds of one request (serve.max_request_cpu_seconds); None: no CPU limit


def worker_count(setting: int) -> int:
    """serve.workers: 0 means one worker per core this process may run on."""
    return setting or len(os.sched_getaffinity(0))


def start_forkserver(module: str) -> None:
    """Start the forkserver with `module` imported, before a model's load puts its packed code first on sys.path:
    the workers then fork with the modules the server imported, and do not run the server's script again."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([module])
    multiprocessing.forkserver.ensure_running()


def _serve(connection: Connection, setup: Setup, limits: WorkerLimits) -> None:
    """The worker's loop: limits first, then the model, then one request after another until the pipe closes."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a worker ended over a limit writes no core file
    memory = limits.memory_mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    handler = setup()
    while True:
        try:
            payload = connection.recv()
        except EOFError:  # the server closed the pipe: it is stopping or replacing this worker
            return
        if limits.cpu_seconds is not None:
            used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
            # +1: the request's own between-step check (a 400 saying how far it got) comes first where it can
            soft = math.ceil(used + limits.cpu_seconds) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        try:
            answer = (_OK, handler(payload))
        except MemoryError:
            connection.send((_MEMORY, None))
            return  # whatever failed to allocate may have left state half-built: a fresh worker replaces this one
        except Exception as error:  # a bug in the handler: the traceback goes to the server's log
            log.exception("worker failed")
            answer = (_FAILED, type(error).__name__)
        del payload
        connection.send(answer)


class _Worker:
    def __init__(self, context, setup: Setup, limits: WorkerLimits):
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, setup, limits), daemon=True)
        self.process.start()
        child.close()

    def stop(self) -> None:
        self.connection.close()
        if self.process.is_alive():
            self.process.kill()
        self.process.join()


class Workers:
    """`count` worker processes, each running `setup()`'s handler under `limits`; `run` hands one payload to an idle
    one and returns its answer, or raises OverLimit naming the limit that stopped it."""

    def __init__(self, count: int, setup: Setup, limits: WorkerLimits):
        self.context = multiprocessing.get_context("forkserver")
        self.setup, self.limits = setup, limits
        self.idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self.workers = [_Worker(self.context, setup, limits) for _ in range(count)]
        for worker in self.workers:
            self.idle.put(worker)

    def run(self, payload: object, deadline: float, timeout_name: str) -> object:
        """`payload`'s answer from one worker, by `deadline` (time.monotonic; `timeout_name` names its setting)."""
        try:
            worker = self.idle.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise OverLimit(f"no worker was free before the request's timeout ({timeout_name})", timeout_name, True)
        healthy = False
        try:
            answer = self._answer(worker, payload, deadline, timeout_name)
            healthy = True
            return answer
        finally:
            self.idle.put(worker if healthy else self._replace(worker))

    def _answer(self, worker: _Worker, payload: object, deadline: float, timeout_name: str) -> object:
        try:
            worker.connection.send(payload)
            if not worker.connection.poll(max(0.0, deadline - time.monotonic())):
                raise OverLimit(
                    f"the request passed the server's timeout ({timeout_name}); its worker was stopped", timeout_name
                )
            status, value = worker.connection.recv()
        except (EOFError, OSError):  # the worker died: the kernel ended it, or a C library crashed under its limits
            worker.process.join(5)
            raise self._death(worker.process.exitcode) from None
        if status == _MEMORY:
            raise self._over_memory("a MemoryError")
        if status == _FAILED:
            raise RuntimeError(f"the worker failed with {value} (traceback in the server log)")
        return value

    def _death(self, exitcode: int | None) -> OverLimit:
        if exitcode == -signal.SIGXCPU:
            return OverLimit(
                f"the request used its {self.limits.cpu_seconds} CPU-seconds (serve.max_request_cpu_seconds) inside "
                "one decoding or model step; the operating system stopped its worker",
                "serve.max_request_cpu_seconds",
            )
        how = f"signal {signal.Signals(-exitcode).name}" if exitcode and exitcode < 0 else f"exit code {exitcode}"
        return self._over_memory(how)

    def _over_memory(self, how: str) -> OverLimit:
        # What else ends a worker: an allocation past RLIMIT_AS, raised as MemoryError or crashing the C library
        # that asked for it.
        return OverLimit(
            f"the request's worker stopped ({how}) at its memory limit of {self.limits.memory_mib} MiB "
            "(serve.worker_memory_mib): send smaller images",
            "serve.worker_memory_mib",
        )

    def _replace(self, worker: _Worker) -> _Worker:
        worker.stop()
        fresh = _Worker(self.context, self.setup, self.limits)
        self.workers[self.workers.index(worker)] = fresh
        return fresh

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
