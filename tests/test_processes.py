"""executor: processes gives bitwise the numbers of the sequential executor, and cleans up."""

import os

import pytest
import torch
from tiny import tiny_config, without_timing

from fedbug.config import resolve
from fedbug.engine import Experiment, run_experiment
from fedbug.engine.client import ClientTask
from fedbug.engine.executors.processes import AHEAD, ProcessExecutor, WorkerError, WorkerSpec


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
    ex = ProcessExecutor(WorkerSpec(cfg), workers=2, threads=1)
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


def test_a_round_streams_in_client_order_holding_a_bounded_number_of_updates():
    """Updates come back one at a time in client id order; a client's state is read when it is
    handed out, never more than AHEAD x workers past the update the server takes; stopping the
    stream early leaves the workers ready for the next round."""
    cfg = resolve(tiny_config(threads=1, num_clients=12, clients_per_round=12))
    exp = Experiment(cfg)
    tasks = [ClientTask(1, i, cfg.seed, 0.1, exp.mean_samples) for i in reversed(range(12))]
    w = exp.initial_weights()

    class Watched(dict):
        def __init__(self):
            super().__init__({i: {} for i in range(12)})
            self.read: list[int] = []

        def __getitem__(self, client):
            self.read.append(client)
            return super().__getitem__(client)

    ex = ProcessExecutor(WorkerSpec(cfg), workers=2, threads=1)
    try:
        states = Watched()
        taken = []
        for res in ex.stream_round(w, tasks, states):
            taken.append(res.client)
            assert len(states.read) <= len(taken) + AHEAD * 2  # handed out, at most
        assert taken == list(range(12)) and states.read == list(range(12))
        stream = ex.stream_round(w, tasks, Watched())
        first = next(stream)
        stream.close()  # the server stops early: the in-flight updates are taken and dropped
        again = ex.run_round(w, tasks[:3], {i: {} for i in range(12)})
        assert [r.client for r in again] == [9, 10, 11]
        assert torch.equal(first.delta, ex.run_round(w, tasks[-1:], {0: {}})[0].delta)
    finally:
        ex.close()
