"""Worker processes whose cost the operating system bounds: `make serve` parses, decodes and translates every request
in one, so the server process itself only moves bytes.

A request's body is untrusted from its first byte: MLflow's JSON parser, Pillow's header and chunk readers (a PNG's
iCCP chunks, a JPEG's markers), its `load()`, tifffile's decoders and an onnxruntime run are single C calls, or
Python loops, whose cost no header states. Checks between steps cannot stop them, so the limits hold for the process
instead, whatever the format:

- memory: `RLIMIT_AS` (serve.worker_memory_mib), set in the worker before it loads anything; an allocation past it
  fails (a MemoryError, or a crash inside a C library) and the worker is replaced.
- CPU: `RLIMIT_CPU`, raised before each request to the seconds used so far plus the request's budget (the served
  model's own, which the worker reports once loaded); past it the kernel ends the worker with SIGXCPU.
- wall clock: the parent waits for the answer until the request's deadline and kills the worker then (a worker may
  also be stuck without using CPU).

A worker serves one request at a time; a request waits for an idle one until its deadline. A worker that stopped over
a limit is replaced by a fresh one before the next request takes its place. Bodies and answers cross the pipe as raw
bytes (no pickled copy). The workers start from multiprocessing's 'forkserver' (the server process has threads,
which `fork` would copy in whatever state they were in).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import multiprocessing.forkserver
import queue
import resource
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Callable

from thermal2visible.errors import PipelineError

log = logging.getLogger(__name__)

Handler = Callable[[object, bytes], tuple[object, bytes]]  # (head, body) of a request -> (head, body) of its answer


@dataclass(frozen=True)
class Loaded:
    """What a worker's setup returns: its handler, one request's CPU-seconds (None: no limit) and what the server
    is told once the worker is ready (picklable)."""

    handler: Handler
    cpu_seconds: float | None
    told: dict = field(default_factory=dict)


Setup = Callable[[], Loaded]  # picklable: builds the handler inside the worker (loads the model)

_OK, _FAILED, _MEMORY = "ok", "failed", "memory"


class OverLimit(Exception):
    """A request stopped by a limit: `limit` names it (a params key or MLflow's setting); `busy` is true when no
    worker took it up at all."""

    def __init__(self, message: str, limit: str, busy: bool = False):
        super().__init__(message)
        self.limit = limit
        self.busy = busy


def worker_count(setting: int, bodies_in_flight: int) -> int:
    """serve.workers: 0 means one worker per request the edge lets in at once (serve.max_bodies_in_flight), so a
    request never waits behind costly ones: the kernel shares the cores between all of them."""
    return setting or bodies_in_flight


def start_forkserver(module: str) -> None:
    """Start the forkserver with `module` imported, before anything else runs: the workers then fork with the
    modules the server imported, and do not run the server's script again."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([module])
    multiprocessing.forkserver.ensure_running()


def _serve(connection: Connection, setup: Setup, memory_mib: int) -> None:
    """The worker's loop: limits first, then the model, then one request after another until the pipe closes."""
    # A terminal's Ctrl-C reaches every process of its group: the server stops its workers itself (by closing their
    # pipes), so a worker ignores it rather than printing a traceback of the wait it interrupted
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a worker ended over a limit writes no core file
    memory = memory_mib * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    try:
        loaded = setup()
    except Exception as error:  # the model cannot be served: the server says why and stops
        connection.send(
            (_FAILED, str(error) if isinstance(error, PipelineError) else f"{type(error).__name__}: {error}")
        )
        return
    connection.send((_OK, (loaded.cpu_seconds, loaded.told)))
    while True:
        try:
            head, body = connection.recv(), connection.recv_bytes()
        except EOFError:  # the server closed the pipe: it is stopping or replacing this worker
            return
        if loaded.cpu_seconds is not None:
            used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
            # +1: the request's own between-step check (a 400 saying how far it got) comes first where it can
            soft = math.ceil(used + loaded.cpu_seconds) + 1
            resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))
        try:
            answer_head, answer = loaded.handler(head, body)
        except MemoryError:
            connection.send((_MEMORY, None))
            return  # whatever failed to allocate may have left state half-built: a fresh worker replaces this one
        except Exception as error:  # a bug in the handler: the traceback goes to the server's log
            log.exception("worker failed")
            connection.send((_FAILED, type(error).__name__))
            continue
        del head, body
        connection.send((_OK, answer_head))
        connection.send_bytes(answer)


class _Worker:
    def __init__(self, context, setup: Setup, memory_mib: int):
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, setup, memory_mib), daemon=True)
        self.process.start()
        child.close()
        self.ready: tuple[float | None, dict] | None = None

    def wait_ready(self, timeout: float | None) -> tuple[float | None, dict]:
        """(its CPU-seconds a request, what it told) once its setup is done; PipelineError when the setup failed."""
        if self.ready is None:
            if not self.connection.poll(timeout):
                raise OverLimit("a worker was still loading the model at the request's timeout", "loading", True)
            try:
                status, value = self.connection.recv()
            except (EOFError, OSError):
                self.process.join(5)
                raise PipelineError(
                    f"a request worker ended while loading the model (exit code {self.process.exitcode})"
                )
            if status != _OK:
                raise PipelineError(value)
            self.ready = value
        return self.ready

    def stop(self) -> None:
        self.connection.close()
        if self.process.is_alive():
            self.process.kill()
        self.process.join()


class Workers:
    """`count` worker processes, each running `setup()`'s handler within `memory_mib`; `run` hands one request to an
    idle one and returns its answer, or raises OverLimit naming the limit that stopped it. Starting waits until every
    worker has loaded: `told` is what the first one reported."""

    def __init__(self, count: int, setup: Setup, memory_mib: int):
        self.context = multiprocessing.get_context("forkserver")
        self.setup, self.memory_mib = setup, memory_mib
        self.idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self.workers = [_Worker(self.context, setup, memory_mib) for _ in range(count)]
        try:
            self.cpu_seconds, self.told = [worker.wait_ready(None) for worker in self.workers][0]
        except BaseException:
            self.close()
            raise
        for worker in self.workers:
            self.idle.put(worker)

    def run(self, head: object, body: bytes, deadline: float, timeout_name: str) -> tuple[object, bytes]:
        """The answer to (`head`, `body`) from one worker, by `deadline` (time.monotonic; `timeout_name` names its
        setting)."""
        try:
            worker = self.idle.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise OverLimit(f"no worker was free before the request's timeout ({timeout_name})", timeout_name, True)
        healthy = False
        try:
            answer = self._answer(worker, head, body, deadline, timeout_name)
            healthy = True
            return answer
        finally:
            self.idle.put(worker if healthy else self._replace(worker))

    def _answer(self, worker: _Worker, head: object, body: bytes, deadline: float, timeout_name: str):
        worker.wait_ready(max(0.0, deadline - time.monotonic()))
        try:
            worker.connection.send(head)
            worker.connection.send_bytes(body)
            if not worker.connection.poll(max(0.0, deadline - time.monotonic())):
                raise OverLimit(
                    f"the request passed the server's timeout ({timeout_name}); its worker was stopped", timeout_name
                )
            status, value = worker.connection.recv()
            if status == _OK:
                return value, worker.connection.recv_bytes()
        except (EOFError, OSError):  # the worker died: the kernel ended it, or a C library crashed under its limits
            worker.process.join(5)
            raise self._death(worker.process.exitcode) from None
        if status == _MEMORY:
            raise self._over_memory("a MemoryError")
        raise RuntimeError(f"the worker failed with {value} (traceback in the server log)")

    def _death(self, exitcode: int | None) -> OverLimit:
        if exitcode == -signal.SIGXCPU:
            return OverLimit(
                f"the request used its {self.cpu_seconds} CPU-seconds (serve.max_request_cpu_seconds) inside one "
                "parsing, decoding or model step; the operating system stopped its worker",
                "serve.max_request_cpu_seconds",
            )
        how = f"signal {signal.Signals(-exitcode).name}" if exitcode and exitcode < 0 else f"exit code {exitcode}"
        return self._over_memory(how)

    def _over_memory(self, how: str) -> OverLimit:
        # What else ends a worker: an allocation past RLIMIT_AS, raised as MemoryError or crashing the C library
        # that asked for it.
        return OverLimit(
            f"the request's worker stopped ({how}) at its memory limit of {self.memory_mib} MiB "
            "(serve.worker_memory_mib): send smaller images",
            "serve.worker_memory_mib",
        )

    def _replace(self, worker: _Worker) -> _Worker:
        worker.stop()
        fresh = _Worker(self.context, self.setup, self.memory_mib)
        self.workers[self.workers.index(worker)] = fresh
        return fresh

    def close(self) -> None:
        for worker in self.workers:
            worker.stop()
