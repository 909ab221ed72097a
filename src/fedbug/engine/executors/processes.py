"""Clients in worker processes: ``executor: processes`` with ``workers`` processes.

Each worker is started once per run (``spawn``), builds its own
:class:`~fedbug.engine.experiment.ClientSide` (never the round loop) from the run's config and
data (the data set's tensors travel once, in shared memory), sets
``torch.set_num_threads(threads)`` and keeps one :class:`~fedbug.client.ClientRuntime` for the
whole run. A round's tasks are dealt to the
workers (largest clients first, each to the least loaded worker); each worker runs
:func:`~fedbug.client.train_client` on its share exactly as the sequential executor does, so
with randomness addressed by (seed, round, client) the results are bitwise those of
:class:`~fedbug.engine.executors.sequential.SequentialExecutor` (at the same thread count).

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
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import torch
from torch import Tensor, nn

from fedbug.client import ClientResult, ClientTask, train_client
from fedbug.engine.executors.base import Executor
from fedbug.engine.experiment import ClientSide

#: Seconds a worker may take to start (import torch, build its experiment) or to stop.
START_TIMEOUT = 600.0
STOP_TIMEOUT = 10.0


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
        torch.set_num_threads(threads)
        exp = ClientSide(spec.cfg, spec.dataset, spec.model, spec.task)
        torch.set_num_threads(threads)  # ClientSide sets the config's count; keep ours
        runtime = exp.make_runtime()
        _send(conn, ("ready", None))
    except BaseException:
        _send(conn, ("error", traceback.format_exc()))
        conn.close()
        return
    while True:
        try:
            msg = _recv(conn)
        except (EOFError, OSError):
            break
        if msg is None:
            break
        weights, tasks, states = msg
        try:
            results = [
                train_client(weights, t, exp.client_data(t.client), states[t.client], runtime)
                for t in tasks
            ]
            _send(conn, ("ok", results))
        except BaseException:
            _send(conn, ("error", traceback.format_exc()))
    conn.close()


def deal(tasks: list[ClientTask], sizes: list[int], workers: int) -> list[list[ClientTask]]:
    """Tasks per worker: the largest clients first, each to the least loaded worker (by
    samples); within a worker in client order. Which worker trains a client changes no
    number."""
    loads = [0] * workers
    shares: list[list[ClientTask]] = [[] for _ in range(workers)]
    for t in sorted(tasks, key=lambda t: (-sizes[t.client], t.client)):
        k = min(range(workers), key=lambda j: (loads[j], j))
        shares[k].append(t)
        loads[k] += max(1, sizes[t.client])
    return [sorted(s, key=lambda t: t.client) for s in shares]


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
        sizes: list[int],
        workers: int = 2,
        threads: int = 1,
        start_method: str = "spawn",
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        self.sizes = list(sizes)
        self.workers = workers
        ctx = mp.get_context(start_method)
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._conns)
        try:
            for k in range(workers):
                here, there = ctx.Pipe(duplex=True)
                p = ctx.Process(
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

    def run_round(
        self, weights: Tensor, tasks: list[ClientTask], states: dict[int, dict[str, Tensor]]
    ) -> list[ClientResult]:
        if not self._procs:
            raise WorkerError("the process executor is closed")
        shares = deal(tasks, self.sizes, self.workers)
        busy = []
        try:
            for k, share in enumerate(shares):
                if share:
                    _send(
                        self._conns[k],
                        (weights, share, {t.client: states[t.client] for t in share}),
                    )
                    busy.append(k)
            results: list[ClientResult] = []
            for k in busy:
                results.extend(self._receive(k))
        except BaseException:
            self.close()
            raise
        return sorted(results, key=lambda r: r.client)

    def close(self) -> None:
        """Stop and join every worker (idempotent)."""
        _stop(self._procs, self._conns)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]
