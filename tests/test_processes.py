"""executor: processes gives bitwise the numbers of the sequential executor, and cleans up."""

import os

import pytest
import torch
from tiny import tiny_config, without_timing

from fedbug.client import ClientTask
from fedbug.config import resolve
from fedbug.engine import Experiment, run_experiment
from fedbug.engine.executors.processes import ProcessExecutor, WorkerError, WorkerSpec, deal


def _children() -> set[int]:
    """This process's child pids, zombies included, less multiprocessing's resource tracker
    (which lives as long as the interpreter)."""
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as f:
            pids = {int(p) for p in f.read().split()}
    except OSError:
        return set()
    out = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"resource_tracker" in f.read():
                    continue
        except OSError:
            pass
        out.add(pid)
    return out


def test_process_executor_equals_sequential_bitwise_with_client_state():
    # FedDyn: lambda_i travels to the workers and back; 2 workers, 2 rounds
    cfg = tiny_config(
        algorithm="feddyn", policy="bottom_up", bottom_up={"gu_ratio": 0.5}, threads=1
    )
    before = _children()
    seq = run_experiment(cfg)
    par = run_experiment(cfg.model_copy(update={"executor": "processes", "workers": 2}))
    assert without_timing(par.records) == without_timing(seq.records)
    assert torch.equal(par.weights, seq.weights)
    assert _children() <= before  # the workers were joined: no zombie, no orphan


def test_results_sorted_by_client_and_worker_error_stops_all_workers():
    cfg = resolve(tiny_config(threads=1, clients_per_round=5))
    exp = Experiment(cfg)
    tasks = [ClientTask(1, i, cfg.seed, 0.1, exp.mean_samples) for i in (4, 0, 3, 1)]
    shares = deal(tasks, exp.sizes, 3)
    assert sorted(t.client for s in shares for t in s) == [0, 1, 3, 4]
    assert all(shares)
    ex = ProcessExecutor(WorkerSpec(cfg), exp.sizes, workers=2, threads=1)
    pids = ex.pids
    try:
        res = ex.run_round(exp.initial_weights(), tasks, {t.client: {} for t in tasks})
        assert [r.client for r in res] == [0, 1, 3, 4]
        with pytest.raises(WorkerError, match="worker 0 failed"):
            ex.run_round(torch.zeros(3), tasks[:1], {4: {}})  # wrong-size weights: it raises
        assert ex.pids == []  # an error closes the executor
    finally:
        ex.close()
    assert not (set(pids) & _children())
