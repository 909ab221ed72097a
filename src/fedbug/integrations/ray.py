"""Many runs on a Ray cluster: ``fedbug sweep --ray [ADDRESS]`` submits each (cell, seed) run as
a Ray task, a whole ``fedbug run`` with its own run folder, lock and checkpoints, as ``--jobs``
runs it in a local process (:mod:`fedbug.sweeps.jobs`: the worker's code and its errors are the
same).

The run folders are under the caller's ``--out``, which every node must see at the same path
(shared storage): a task writes its folder where it runs, and the caller reads the results
there. Every node imports the caller's fedbug (a local cluster started from the caller's
environment does) and finds the data (``data_dir``, or each node's cache). A task imports the
caller's own modules (``--import``) as a ``--jobs`` worker does: their names, or the paths of
their files, which every node must then see at the same path.

A task asks Ray for the config's ``threads`` CPUs (1 where it sets none) and runs with that many
torch threads, so a sweep on Ray gives bit for bit the sequential sweep's numbers with the same
``threads``. A task whose worker dies (node lost, process killed, out of memory) is run again,
up to :data:`RETRIES` times, by ``run_one`` on the folder its attempt left: ``run_one`` must
resume from the checkpoint there (a killed run's ``flock`` went with its process, so the retry
takes the folder; on NFS a lost node's lock lasts until the server's lease ends, about 90 s for
NFSv4, and a retry that comes sooner finds the folder busy). A run that fails by itself (a
fedbug error, a bug) is not retried: it stops the sweep as one error. Ctrl-C cancels every task;
``--resume`` continues.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedbug.config import BaseConfig
from fedbug.core.user_modules import IMPORT_ENV, env_entries
from fedbug.errors import ConfigError, FedbugError, first_line
from fedbug.models import ALLOW_IMPORT_ENV, factories_allowed
from fedbug.results import RunDir
from fedbug.sweeps.jobs import OnJobRound, RunOne, job_result, run_pickled_job

INSTALL_HINT = 'pip install "fedbug[ray]"'
#: times Ray runs a task again after its worker died (Ray's own default for tasks)
RETRIES = 3
#: seconds to wait for a named cluster to answer before calling it unreachable
CONNECT_TIMEOUT = 5.0


def require_ray() -> Any:
    """The ``ray`` module, or one :class:`ConfigError` naming the install."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            f"--ray needs Ray, which is not installed; install it with {INSTALL_HINT}"
        ) from None
    return ray


def task_config(cfg: BaseConfig) -> BaseConfig:
    """``cfg`` as its Ray task runs it: its own ``threads``, else 1 (a task's CPUs)."""
    return cfg if cfg.threads is not None else cfg.model_copy(update={"threads": 1})


def check_reachable(address: str) -> None:
    """Refuse, in one line, a named cluster (``HOST:PORT``, ``ray://HOST:PORT``) that does not
    answer: Ray itself would wait minutes. ``auto`` (without ``RAY_ADDRESS``, which Ray reads
    for it) is Ray's to find."""
    if address == "auto":
        return
    where = address.removeprefix("ray://")
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--ray takes auto, HOST:PORT or ray://HOST:PORT; got {address!r}")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT).close()
    except OSError as e:
        raise FedbugError(
            f"no Ray cluster answers at {address} ({e.strerror or e}); start one with "
            "`ray start --head` or name its address"
        ) from None


def connect(ray: Any, address: str) -> None:
    """``ray.init`` on a running cluster, quietly; one :class:`FedbugError` if it fails."""
    named = os.environ.get("RAY_ADDRESS") if address == "auto" else address  # as Ray reads it
    check_reachable(named or "auto")
    try:
        with warnings.catch_warnings():  # a tip about GPUs fedbug does not ask Ray for
            warnings.filterwarnings("ignore", message="Tip: In future versions of Ray")
            ray.init(address=address, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError, ValueError) as e:
        why = " ".join(str(e).split())[:300] or type(e).__name__  # Ray's, on one line
        raise FedbugError(f"cannot connect to the Ray cluster at {address}: {why}") from None


def _outcome(ray: Any, ref: Any, run_dir: Path) -> tuple[str, Any, int]:
    """A finished task's outcome (:func:`~fedbug.sweeps.jobs.run_job`'s), Ray's own failures as one
    fedbug error."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:  # raised outside run_job: it did not get to run
        cause = e.cause if e.cause is not None else e
        raise FedbugError(
            f"{run_dir}: its Ray task could not run fedbug ({type(cause).__name__}: "
            f"{_first_sentence(cause)}); every node must import the caller's fedbug: install it "
            "in the cluster's Python"
        ) from None
    except ray.exceptions.RayError as e:  # its worker died once more than it is retried
        raise FedbugError(
            f"{run_dir}: its Ray task was lost {RETRIES + 1} times ({type(e).__name__}: "
            f"{_first_sentence(e)}); --resume continues it from its checkpoint"
        ) from None


def _first_sentence(e: BaseException) -> str:
    return first_line(e, empty="").split(". ")[0]


def run_ray_jobs(
    run_one: RunOne,
    jobs: list[tuple[BaseConfig, Path]],
    address: str,
    on_round: OnJobRound | None = None,
    on_done: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every ``(cfg, run_dir)`` through ``run_one`` (a module-level function, or a
    ``functools.partial`` of one, that resumes what a killed attempt left) as a Ray task on the
    cluster at ``address``; the results in the order of ``jobs``. ``on_round`` gets each run's
    rounds as its ``metrics.jsonl`` shows them (read here: the folders are shared). The first
    failed run cancels the rest and raises, as Ctrl-C does."""
    ray = require_ray()
    connect(ray, address)
    try:
        refs = _submit(ray, run_one, jobs)
        return _gather(ray, refs, jobs, on_round, on_done)
    finally:
        ray.shutdown()


def _submit(ray: Any, run_one: RunOne, jobs: list[tuple[BaseConfig, Path]]) -> list[Any]:
    """One Ray task a job, asking for its config's ``threads`` CPUs (:func:`task_config`) and
    retried :data:`RETRIES` times if its worker dies; their refs in the order of ``jobs``."""
    task = ray.remote(run_pickled_job)
    env = _worker_env()
    refs = []
    for i, (cfg, run_dir) in enumerate(jobs):
        cfg = task_config(cfg)
        opts = task.options(
            num_cpus=cfg.threads,
            max_retries=RETRIES,
            retry_exceptions=False,
            name=run_dir.name,
            **({"runtime_env": {"env_vars": env}} if env else {}),
        )
        pickled = pickle.dumps(cfg, protocol=pickle.HIGHEST_PROTOCOL)
        refs.append(opts.remote(run_one, i, pickled, run_dir.absolute()))
    return refs


def _worker_env() -> dict[str, str]:
    """The caller's ``--allow-import`` and ``--import``, as the cluster's workers get them."""
    env = {ALLOW_IMPORT_ENV: "1"} if factories_allowed() else {}
    if env_entries():
        env[IMPORT_ENV] = os.environ[IMPORT_ENV]
    return env


def _gather(
    ray: Any,
    refs: list[Any],
    jobs: list[tuple[BaseConfig, Path]],
    on_round: OnJobRound | None,
    on_done: Callable[[int], None] | None,
) -> list[dict[str, Any]]:
    """Each task's result as it finishes, in the order of ``jobs``; meanwhile the rounds the
    unfinished runs wrote to ``on_round``. Any exception (a failed run, Ctrl-C) cancels the
    tasks still running."""
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[dict[str, Any]] = [{} for _ in jobs]
    sizes: dict[int, int] = {}
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=1.0)
            for ref in ready:
                i = index[ref]
                results[i] = _finished(ray, ref, jobs[i][1])
                if on_round is not None and results[i]["records"]:
                    on_round(i, results[i]["records"][-1])
                if on_done is not None:
                    on_done(i)
            if on_round is not None:
                for ref in pending:
                    i = index[ref]
                    rec = _new_round(jobs[i][1], sizes, i)
                    if rec is not None:
                        on_round(i, rec)
    except BaseException:
        for ref in pending:  # Ctrl-C or a failed run: checkpoints stay for --resume
            ray.cancel(ref, force=True)
        raise
    return results


def _finished(ray: Any, ref: Any, run_dir: Path) -> dict[str, Any]:
    """A finished task's result, its folder as the caller named it (the task wrote it by its
    absolute path)."""
    done = job_result(_outcome(ray, ref, run_dir), run_dir)
    return {**done, "run_dir": run_dir}


def _new_round(run_dir: Path, sizes: dict[int, int], i: int) -> dict[str, Any] | None:
    """Run ``i``'s last round when its ``metrics.jsonl`` changed size since the last look."""
    rd = RunDir(run_dir)
    try:
        size = rd.metrics_path.stat().st_size
    except OSError:
        return None
    if sizes.get(i) == size:
        return None
    sizes[i] = size
    return rd.last_record()
