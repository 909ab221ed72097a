"""Many runs at once: ``fedbug sweep --jobs N`` runs its (cell, seed) runs on N worker
processes, each a whole ``fedbug run`` with its own run folder, lock and checkpoints.

A job's torch threads are the config's ``threads`` where it sets them, else the machine's cores
divided among the jobs. A run's numbers depend on its thread count (CPU kernels split sums by
thread), so a parallel sweep gives bit for bit the numbers of the sequential sweep run with the
same ``threads`` (set ``threads`` in the config to have both). Workers are spawned (never
forked from a process that has started torch's thread pools). Ctrl-C stops every worker; each
run folder keeps its last checkpoint, and ``--resume`` continues. A worker dies with the sweep
however the sweep ends (SIGKILL too: Linux's parent-death signal, and a check at its start for
a parent already gone), so no orphan goes on training and holding its run folder's lock. A
worker that dies under the sweep (killed, or unable to start) stops it with one error naming
the run it held (:func:`worker_died`), where the pool alone would wait forever for that run.

A sweep starts no more workers than it has runs (:func:`pool_size`); more workers than cores
(:func:`available_cores`) share them, which the command line warns about.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue as queue_mod
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedbug.config import BaseConfig
from fedbug.core.process import die_with_parent, quiet_resource_tracker
from fedbug.core.user_modules import import_from_env
from fedbug.errors import FedbugError

#: run_one(cfg, run_dir, on_round) -> the run as ``{"run_dir", "records", "summary"}``
RunOne = Callable[[BaseConfig, Path, Callable[[dict[str, Any]], None] | None], dict[str, Any]]
#: on_round(job index, round record) in the parent, for progress
OnJobRound = Callable[[int, dict[str, Any]], None]

_QUEUE: Any = None
#: the key of the message a pool's worker sends as it starts a job: its pid
STARTED = "worker_pid"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one: a container's
    or ``taskset``'s share, not the machine's count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def pool_size(workers: int, runs: int) -> int:
    """The worker processes to start for ``runs`` runs when ``workers`` were asked for: never
    more than the runs (a worker with nothing to run costs a Python with torch, ~0.25 GB)."""
    return max(1, min(workers, runs))


def job_config(cfg: BaseConfig, jobs: int) -> BaseConfig:
    """``cfg`` as one of ``jobs`` parallel jobs runs it: its own ``threads``, else the cores
    divided among the jobs."""
    if cfg.threads is not None:
        return cfg
    return cfg.model_copy(update={"threads": max(1, available_cores() // jobs)})


class JobError(FedbugError):
    """A job's run failed with a fedbug error: its message and exit code, from the worker."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _init(q: Any, parent: int, show: Callable[..., None] | None = None) -> None:
    """A pool worker's start: die with the sweep (``parent``, its pid), keep its queue, show
    warnings as the sweep does (``show``: the command line's one-line display, where set),
    import the sweep's own modules (``--import``: :data:`~fedbug.core.user_modules.IMPORT_ENV`,
    inherited) before a job's config is unpickled, and ignore SIGINT: a terminal's Ctrl-C
    reaches the whole process group, and the sweep owns it (it stops every worker); a worker
    that took it would print its KeyboardInterrupt's traceback under the sweep's one line."""
    global _QUEUE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if show is not None:
        warnings.showwarning = show
    if sys.platform == "linux":
        die_with_parent()
    if os.getppid() != parent:  # the sweep died before the signal was asked for: nothing to do
        os._exit(1)
    _QUEUE = q
    with contextlib.suppress(FedbugError):  # before a job's config arrives; run_job says why
        import_from_env()


def _warning_display() -> Callable[..., None] | None:
    """This process's warning display where fedbug set it (the ``fedbug`` command's one-line
    form: a module-level function, which a spawned worker imports by name), else None (the
    worker keeps Python's)."""
    show = warnings.showwarning
    module = getattr(show, "__module__", "") or ""
    return show if module.startswith("fedbug.") and "<locals>" not in show.__qualname__ else None


def run_job(run_one: RunOne, index: int, cfg: BaseConfig, run_dir: Path) -> tuple[str, Any, int]:
    """In a worker (a pool's process or a Ray task): one run, after importing the sweep's own
    modules (``--import``); its result, or its error as plain, picklable values
    (:func:`job_result` reads them back). In a pool's process each
    round goes to the parent through the pool's queue, after the worker's pid (:data:`STARTED`)."""

    def on_round(rec: dict[str, Any]) -> None:
        keep = ("round", "test_acc", "test_loss")
        _QUEUE.put((index, {k: rec[k] for k in keep if k in rec}))

    try:
        if _QUEUE is not None:  # which worker runs it: the run a dead worker held is named
            _QUEUE.put((index, {STARTED: os.getpid()}))
        import_from_env()  # the sweep's --import modules (FEDBUG_IMPORT), as the sweep has them
        return "ok", run_one(cfg, run_dir, on_round if _QUEUE is not None else None), 0
    except FedbugError as e:
        return "fedbug", e.cli_message or str(e), e.exit_code
    except Exception:
        return "bug", traceback.format_exc(), 1


def run_pickled_job(
    run_one: RunOne, index: int, pickled: bytes, run_dir: Path
) -> tuple[str, Any, int]:
    """:func:`run_job` for a Ray task, its config pickled by the caller: read here only after
    the sweep's own modules are imported, as the pickle may name their classes (an options
    block of a user's policy), which Ray would look for before the task ran."""
    try:
        import_from_env()
        cfg = pickle.loads(pickled)
    except FedbugError as e:
        return "fedbug", e.cli_message or str(e), e.exit_code
    except Exception:
        return "bug", traceback.format_exc(), 1
    return run_job(run_one, index, cfg, run_dir)


def job_result(outcome: tuple[str, Any, int], run_dir: Path) -> dict[str, Any]:
    """A worker's outcome (:func:`run_job`) as the run, or its error raised: a fedbug error as
    :class:`JobError` naming the run folder, anything else with the worker's traceback."""
    kind, value, code = outcome
    if kind == "fedbug":
        raise JobError(f"{run_dir}: {value}", code)
    if kind == "bug":
        raise RuntimeError(f"run {run_dir} failed:\n{value}")
    return value


#: What a sweep says when a worker process ended under it (its run, or a start that failed).
WORKER_DIED = (
    "a worker process of the sweep ended before its run finished (killed: out of memory, or a "
    "signal; or it failed to start: a Python script that starts a sweep needs its code under "
    'if __name__ == "__main__": as spawned workers import the script); the run folders keep '
    "their checkpoints: --resume continues"
)


def worker_died(runs: list[Path]) -> str:
    """:data:`WORKER_DIED`, naming the ``runs`` the dead workers held where they are known (a
    worker that failed to start held none)."""
    if not runs:
        return WORKER_DIED
    held = ", ".join(str(r) for r in runs)
    return (
        f"the worker process of the sweep running {held} ended before its run finished "
        "(killed: out of memory, or a signal); the run folders keep their checkpoints: "
        "--resume continues"
    )


def _lost(pool: Any, pids: set[int | None], held: dict[int, int], pending: list[Any]) -> list[int]:
    """The jobs, unfinished, whose worker (``held``: job -> pid, as each worker said) is one of
    the ``pids`` the pool started with that has died."""
    alive = {w.pid for w in pool._pool if w.exitcode is None}
    return sorted(i for i, pid in held.items() if pid in pids - alive and not pending[i].ready())


def _worker_pids(pool: Any) -> set[int | None]:
    """The pids of ``pool``'s worker processes (a pool puts a new worker in a dead one's place,
    so a change is a worker that died)."""
    return {w.pid for w in pool._pool}


def _outcome(
    pending: Any, pool: Any, pids: set[int | None], lost: Callable[[], list[Path]]
) -> tuple[str, Any, int]:
    """A job's outcome (:func:`run_job`) once it comes; a worker of ``pool`` that died meanwhile
    raises :class:`JobError` (exit code 3, a stopped run) naming the runs it held (``lost``):
    the pool never gives the job a dead worker held to another, so waiting on would be
    forever."""
    while True:
        try:
            return pending.get(timeout=0.5)
        except mp.TimeoutError:
            if _worker_pids(pool) != pids or any(w.exitcode is not None for w in pool._pool):
                raise JobError(worker_died(lost()), 3) from None


def run_jobs(
    run_one: RunOne,
    jobs: list[tuple[BaseConfig, Path]],
    workers: int,
    on_round: OnJobRound | None = None,
    on_done: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every ``(cfg, run_dir)`` through ``run_one`` (a module-level function, or a
    ``functools.partial`` of one: it is sent to the workers) on ``workers`` processes; the
    results in the order of ``jobs``. The first failed run stops the rest and raises. No more
    workers start than there are jobs."""
    workers = pool_size(workers, len(jobs))
    ctx = mp.get_context("spawn")
    quiet_resource_tracker()  # a SIGKILLed sweep's semaphores removed without a warning
    q = ctx.Queue()
    stop = threading.Event()
    held: dict[int, int] = {}  # job -> the pid of the worker that started it

    def drain() -> None:
        while not stop.is_set():
            try:
                index, rec = q.get(timeout=0.2)
            except queue_mod.Empty:
                continue
            if STARTED in rec:
                held[index] = rec[STARTED]
            elif on_round is not None:
                on_round(index, rec)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    pool = ctx.Pool(workers, initializer=_init, initargs=(q, os.getpid(), _warning_display()))
    workers_at_start = _worker_pids(pool)
    try:
        pending = [
            pool.apply_async(run_job, (run_one, i, job_config(cfg, workers), run_dir))
            for i, (cfg, run_dir) in enumerate(jobs)
        ]
        results = []

        def lost() -> list[Path]:
            return [jobs[k][1] for k in _lost(pool, workers_at_start, held, pending)]

        for i, p in enumerate(pending):
            results.append(job_result(_outcome(p, pool, workers_at_start, lost), jobs[i][1]))
            if on_done is not None:
                on_done(i)
        pool.close()
        return results
    finally:
        pool.terminate()  # Ctrl-C or a failed run: stop every worker (checkpoints stay)
        pool.join()
        stop.set()
        reader.join(timeout=2)
