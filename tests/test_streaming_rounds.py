"""A round aggregates each update as it arrives and lets it go (issue 18: constant-memory
rounds): with the sequential executor at most one client's update is alive at a time, unless
the selection reads every update (FreezeFL's reputation) or the round may still fail to reach
``min_results``; the numbers are those of the golden test (tests/test_golden.py)."""

from __future__ import annotations

import gc
import weakref

import pytest
from tiny import tiny_config

from fedbug.engine import run_experiment
from fedbug.engine.executors import SequentialExecutor


def _watch(monkeypatch) -> list[int]:
    """The number of earlier updates (deltas) still alive each time a client finishes."""
    alive: list[int] = []

    class Watching(SequentialExecutor):
        def stream_round(self, weights, tasks, states):
            refs: list[weakref.ref] = []
            for res in super().stream_round(weights, tasks, states):
                gc.collect()
                alive.append(sum(r() is not None for r in refs))
                refs.append(weakref.ref(res.delta))
                yield res
                del res  # this watcher holds none while the next client trains

    monkeypatch.setattr("fedbug.engine.executors.SequentialExecutor", Watching)
    return alive


def test_one_update_alive_at_a_time(monkeypatch):
    alive = _watch(monkeypatch)
    run_experiment(tiny_config(algorithm="feddyn", clients_per_round=4, num_clients=6))
    assert len(alive) == 8 and max(alive) == 0


def test_the_first_updates_wait_while_the_round_may_not_aggregate(monkeypatch):
    alive = _watch(monkeypatch)
    run_experiment(tiny_config(clients_per_round=4, num_clients=6, min_results=3))
    assert alive[:4] == [0, 1, 2, 0]  # two wait for the third; then each goes at once


@pytest.mark.parametrize("freeze", ["freezefl"])
def test_a_selection_that_reads_the_updates_keeps_them(monkeypatch, freeze):
    alive = _watch(monkeypatch)
    cfg = tiny_config(
        method=freeze, clients_per_round=3, num_clients=6, system={"abilities": "uniform"}
    )
    assert cfg.resolved_selection() == "reputation"
    run_experiment(cfg)
    assert alive[:3] == [0, 1, 2]
