"""The executor base (engine/executors/base.py): a subclass defines stream_round, run_round or
both, each defaulting to the other; one that defines neither is refused when it is declared."""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_config

from fedbug.engine import run_experiment
from fedbug.engine.executors import Executor, SequentialExecutor


class WholeRound(Executor):
    """A user's executor written to train a round at once (only run_round)."""

    def __init__(self, inner: SequentialExecutor) -> None:
        self.inner = inner
        self.calls = 0

    def run_round(self, weights, tasks, states):
        self.calls += 1
        return list(self.inner.stream_round(weights, tasks, states))


def test_an_executor_that_defines_neither_is_refused():
    with pytest.raises(TypeError, match="defines neither stream_round nor run_round"):

        class Nothing(Executor):
            pass


def test_a_run_round_only_executor_gives_the_same_numbers():
    cfg = tiny_config(algorithm="feddyn", clients_per_round=3, num_clients=6)
    made: list[WholeRound] = []

    def factory(exp):
        made.append(WholeRound(SequentialExecutor(exp.make_runtime(), exp.client_data)))
        return made[-1]

    ours = run_experiment(cfg, executor_factory=factory)
    assert made[0].calls == cfg.rounds
    assert torch.equal(ours.weights, run_experiment(cfg).weights)


def test_run_round_of_a_streaming_executor_is_its_stream_collected():
    cfg = tiny_config(clients_per_round=3, num_clients=6)
    made: list[SequentialExecutor] = []
    tasks_seen: list = []

    class Keeping(SequentialExecutor):
        def stream_round(self, weights, tasks, states):
            tasks_seen.append((weights.clone(), list(tasks), dict(states)))
            yield from super().stream_round(weights, tasks, states)

    def factory(exp):
        made.append(Keeping(exp.make_runtime(), exp.client_data))
        return made[-1]

    run_experiment(cfg, executor_factory=factory)
    weights, tasks, states = tasks_seen[0]
    ex = made[0]
    whole = ex.run_round(weights, list(reversed(tasks)), states)
    streamed = list(SequentialExecutor.stream_round(ex, weights, tasks, states))
    assert [r.client for r in whole] == sorted(t.client for t in tasks)
    assert all(torch.equal(a.delta, b.delta) for a, b in zip(whole, streamed, strict=True))
