"""Clients in worker processes: ``executor: processes`` with ``workers`` processes.

Each worker is started once per run (``spawn``), imports the command's own modules
(``--import``, :func:`~fedbug.core.user_modules.import_from_env`), builds its own
:class:`~fedbug.engine.experiment.ClientSide` (never the round loop) from the run's config and
data (the data set's tensors travel once, in shared memory), sets
``torch.set_num_threads(threads)`` and keeps one :class:`~fedbug.engine.client.ClientRuntime` for
the
whole run. A round's tasks go to the
workers one at a time, in client id order, each to the first worker free, and each update comes
back as soon as it is trained: the server aggregates it (in client id order) and lets it go, so
a round holds at most a few updates (:data:`AHEAD` a worker) whatever its number of clients.
Each worker runs :func:`~fedbug.engine.client.train_client` exactly as the sequential executor does,
so with randomness addressed by (seed, round, client) the results are bitwise those of
:class:`~fedbug.engine.executors.sequential.SequentialExecutor` (at the same thread count), and
which worker trains a client changes no number.

Messages are plain pickles over pipes (tensors copied into the message, not left in shared
memory, so no file descriptor is held per result). A worker that raises or dies stops the run
with a :class:`WorkerError` naming it; :meth:`ProcessExecutor.close` (called by the engine when
the run ends, also on errors) stops and joins every worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import pickle
import traceback
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
from torch import Tensor, nn

from fedbug.core.user_modules import import_from_env
from fedbug.engine.client import ClientResult, ClientTask, train_client
from fedbug.engine.executors.base import Executor
from fedbug.engine.experiment import ClientSide

#: Seconds a worker may take to start (import torch, build its experiment) or to stop.
START_TIMEOUT = 600.0
STOP_TIMEOUT = 10.0
#: tasks a worker may be handed beyond the next update the server takes: enough to keep every
#: worker busy, few enough that a round holds a bounded number of updates
AHEAD = 4


class WorkerError(RuntimeError):
    """A worker process failed (an exception in it, or it died)."""


@dataclass
class WorkerSpec:
    """What a worker builds its experiment from: the config, and the data set and model the
    run was given (``None``: load / build them from the config)."""

    cfg: Any
    dataset: Any = None
    model: nn.Module | Any = None
    task: Any = None


def _send(conn: Connection, obj: Any) -> None:
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


def _worker_main(spec: WorkerSpec, threads: int, conn: Connection) -> None:
    """A worker's life: build the runtime, then train the tasks it is sent until told to stop."""
    try:
        import_from_env()  # the command's --import modules: the config may name their methods
        torch.set_num_threads(threads)
        exp = ClientSide(spec.cfg, spec.dataset, spec.model, spec.task)
        torch.set_num_threads(threads)  # ClientSide sets the config's count; keep ours
        runtime = exp.make_runtime()
        _send(conn, ("ready", None))
    except BaseException:
        _send(conn, ("error", traceback.format_exc()))
        conn.close()
        return
    weights: Tensor | None = None
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):
            break
        if msg is None:
            break
        kind, *body = msg
        if kind == "weights":  # the round's global weights, once a round
            (weights,) = body
            continue
        task, state = body
        try:
            assert weights is not None, "a task came before the round's weights"
            result = train_client(weights, task, exp.client_data(task.client), state, runtime)
            _send(conn, ("ok", result))
        except BaseException:
            _send(conn, ("error", traceback.format_exc()))
    conn.close()


def _stop(procs: list[Any], conns: list[Connection]) -> None:
    for conn in conns:
        with contextlib.suppress(OSError, ValueError):
            _send(conn, None)
    for p in procs:
        p.join(STOP_TIMEOUT)
        if p.is_alive():
            p.terminate()
            p.join(STOP_TIMEOUT)
        if p.is_alive():
            p.kill()
            p.join()
    for conn in conns:
        conn.close()
    procs.clear()
    conns.clear()


class ProcessExecutor(Executor):
    """``workers`` processes of ``threads`` torch threads each, started at construction."""

    def __init__(
        self,
        spec: WorkerSpec,
        workers: int = 2,
        threads: int = 1,
        start_method: str = "spawn",
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.workers = workers
        ctx = mp.get_context(start_method)
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._conns)
        try:
            for k in range(workers):
                here, there = ctx.Pipe(duplex=True)
                # typeshed types get_context(str) as BaseContext, which declares no Process;
                # every context it returns (spawn, fork, forkserver) has one
                p = ctx.Process(  # type: ignore[attr-defined]
                    target=_worker_main,
                    args=(spec, threads, there),
                    name=f"fedbug-worker-{k}",
                    daemon=True,
                )
                p.start()
                there.close()
                self._procs.append(p)
                self._conns.append(here)
            for k in range(workers):
                self._receive(k, START_TIMEOUT)
        except BaseException:
            self.close()
            raise

    def _receive(self, k: int, timeout: float | None = None) -> Any:
        """Worker k's next reply; :class:`WorkerError` if it failed or died."""
        conn, proc = self._conns[k], self._procs[k]
        waited = 0.0
        while not conn.poll(1.0):
            waited += 1.0
            if not proc.is_alive():
                if conn.poll(0):  # it may have answered just before exiting
                    break
                raise WorkerError(f"worker {k} died (exit code {proc.exitcode})")
            if timeout is not None and waited >= timeout:
                raise WorkerError(f"worker {k} did not answer within {timeout:.0f} s")
        try:
            kind, value = _recv(conn)
        except (EOFError, OSError) as e:
            raise WorkerError(f"worker {k} closed its pipe (exit code {proc.exitcode})") from e
        if kind == "error":
            raise WorkerError(f"worker {k} failed:\n{value}")
        return value

    def stream_round(
        self, weights: Tensor, tasks: list[ClientTask], states: Mapping[int, dict[str, Tensor]]
    ) -> Iterator[ClientResult]:
        """Each update in client id order as soon as it and those before it are trained; a
        client's state is read when it is handed out."""
        if not self._procs:
            raise WorkerError("the process executor is closed")
        order = sorted(tasks, key=lambda t: t.client)
        done: dict[int, ClientResult] = {}
        busy: dict[int, int] = {}  # worker -> client it trains
        handed = taken = 0
        try:
            for conn in self._conns[: len(order)]:
                _send(conn, ("weights", weights))
            while taken < len(order):
                # hand out work while a worker is free and the round is not too far ahead
                for k in range(min(self.workers, len(order))):
                    if k in busy or handed >= min(len(order), taken + AHEAD * self.workers):
                        continue
                    t = order[handed]
                    _send(self._conns[k], ("task", t, states[t.client]))
                    busy[k] = t.client
                    handed += 1
                while order[taken].client not in done:
                    k = self._next_reply(list(busy))
                    done[busy.pop(k)] = self._receive(k)
                    if handed < len(order):
                        break  # hand the free worker its next task first
                if order[taken].client in done:
                    yield done.pop(order[taken].client)
                    taken += 1
        except GeneratorExit:  # the server stopped early: take what is in flight, then stop
            with contextlib.suppress(WorkerError):
                for k in list(busy):
                    self._receive(k, STOP_TIMEOUT)
            raise
        except BaseException:
            self.close()
            raise

    def _next_reply(self, workers: list[int]) -> int:
        """The first of ``workers`` with a reply (or that died: :meth:`_receive` says so)."""
        while True:
            ready = wait([self._conns[k] for k in workers], timeout=1.0)
            for k in workers:
                if self._conns[k] in ready or not self._procs[k].is_alive():
                    return k

    def close(self) -> None:
        """Stop and join every worker (idempotent)."""
        _stop(self._procs, self._conns)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]
