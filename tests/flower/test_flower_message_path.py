"""Through the Flower message path (serialised Messages, the ClientApp called by a test Grid),
every policy x algorithm pair gives the in-process numbers bitwise."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("flwr")

from flowergrid import LoopbackGrid, task_identity  # noqa: E402
from tiny import method_needs, tiny_config, without_timing  # noqa: E402

from fedbug.algorithms import ALGORITHMS  # noqa: E402
from fedbug.engine import run_experiment  # noqa: E402
from fedbug.errors import ConfigError, ShortRoundError  # noqa: E402
from fedbug.integrations.flower.clientapp import app as client_app  # noqa: E402
from fedbug.integrations.flower.executor import FlowerExecutor  # noqa: E402
from fedbug.policies import POLICIES  # noqa: E402


def on_flower(cfg, grid_kwargs=None, rounds_cfg=None):
    cfg = cfg.model_copy(update={"executor": "flower-simulation"})
    run_config = {"config": json.dumps(cfg.model_dump(mode="json"))}
    grid = LoopbackGrid(client_app, cfg.num_clients, run_config, **(grid_kwargs or {}))
    with task_identity():
        res = run_experiment(
            cfg, executor_factory=lambda exp: FlowerExecutor(grid, exp, map_once=True)
        )
    return res, grid


GLOBAL = [a for a in ALGORITHMS.names() if ALGORITHMS.get(a).has_global_model]


@pytest.mark.parametrize("algorithm", GLOBAL)
@pytest.mark.parametrize("policy", POLICIES.names())
def test_every_policy_algorithm_pair_equals_in_process(algorithm, policy):
    if algorithm == "fjord" and policy != "none":
        pytest.skip("fjord refuses freeze policies (tests/test_engine.py checks the refusal)")
    cfg = tiny_config(
        algorithm=algorithm,
        policy=policy,
        rounds=1,
        threads=1,
        **{"count_flops": False, **method_needs(algorithm, policy)},
    )
    here = run_experiment(cfg)
    there, _ = on_flower(cfg)
    assert without_timing(there.records) == without_timing(here.records)
    assert torch.equal(there.weights, here.weights)


def test_client_state_lives_on_the_node_and_matches_in_process():
    cfg = tiny_config(
        algorithm="feddyn",
        policy="fixed_head",
        rounds=4,
        num_clients=4,
        clients_per_round=2,
        threads=1,
    )
    here = run_experiment(cfg)
    there, grid = on_flower(cfg)
    assert without_timing(there.records) == without_timing(here.records)
    assert torch.equal(there.weights, here.weights)
    held = [c for c in grid.contexts.values() if "fedbug-state" in c.state.array_records]
    assert held, "FedDyn's lambda_i should be kept in the nodes' context.state"
    # partial upload: fixed_head trains only the head, and only the head travels back
    trained = {s.metadata.dst_node_id for s in grid.sent if s.metadata.message_type == "train"}
    assert trained


@pytest.mark.slow
def test_client_level_dp_gives_the_in_process_numbers():
    """Clipped on receipt and noised at the server from a generator seeded by the round: the
    Flower message path gives the in-process run bit for bit, epsilon included."""
    dp = {"clip": 0.5, "noise_multiplier": 1.0, "delta": 1e-5}
    cfg = tiny_config(rounds=2, threads=1, weighting="uniform", dp=dp)
    here = run_experiment(cfg)
    there, _ = on_flower(cfg)
    assert without_timing(there.records) == without_timing(here.records)
    assert torch.equal(there.weights, here.weights)
    assert here.records[-1]["dp_epsilon"] > 0


@pytest.mark.slow
def test_dp_sgd_gives_the_in_process_numbers():
    """DP-SGD's Poisson batches and noise come from the client's (seed, round, client) stream:
    on a Flower node, the same numbers and the same per-client epsilon."""
    pytest.importorskip("opacus")
    cfg = tiny_config(rounds=2, threads=1, dp_sgd={"clip": 1.0, "noise_multiplier": 1.0})
    here = run_experiment(cfg)
    there, _ = on_flower(cfg)
    assert without_timing(there.records) == without_timing(here.records)
    assert torch.equal(there.weights, here.weights)
    assert here.records[-1]["dp_sgd_epsilon"] > 0


def test_replies_in_any_order_give_the_same_numbers():
    cfg = tiny_config(rounds=2, threads=1, clients_per_round=4)
    a, _ = on_flower(cfg)
    b, _ = on_flower(cfg, {"reverse": True})
    assert without_timing(a.records) == without_timing(b.records)
    assert torch.equal(a.weights, b.weights)


def test_a_silent_node_is_dropped_and_recorded(monkeypatch):
    cfg = tiny_config(
        rounds=2,
        threads=1,
        num_clients=4,
        clients_per_round=4,
        flower={"round_timeout": 0.3, "poll_interval": 0.05},
    )
    res, _ = on_flower(cfg, {"silent": {101}})  # node 101 holds partition 1
    for rec in res.records:
        assert 1 not in rec["clients"]
        assert [d["client"] for d in rec["dropped"]] == [1]
        assert "round_timeout" in rec["dropped"][0]["reason"]
        assert rec["num_clients"] == 3


def _one_round_with_node_config(node: int, key: str, value: object) -> dict:
    """One round of 4 clients on 4 loopback nodes, one node's config changed; its record."""
    cfg = tiny_config(rounds=1, threads=1, num_clients=4, clients_per_round=4)
    cfg2 = cfg.model_copy(update={"executor": "flower-simulation"})
    run_config = {"config": json.dumps(cfg2.model_dump(mode="json"))}
    grid = LoopbackGrid(client_app, 4, run_config)
    grid.contexts[node].node_config[key] = value
    with task_identity():
        res = run_experiment(
            cfg2, executor_factory=lambda e: FlowerExecutor(grid, e, map_once=True)
        )
    (rec,) = res.records
    return rec


def test_an_error_reply_is_dropped_with_its_reason():
    rec = _one_round_with_node_config(102, "partition-id", 1)  # two claim 1; none holds 2
    assert [d["client"] for d in rec["dropped"]] == [2]
    assert "no SuperNode" in rec["dropped"][0]["reason"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_node_uses_the_device_of_its_node_config():
    """A node's ``device`` (its own node config) replaces the run's: asked for a GPU this
    machine lacks, that node's client is dropped with the reason, the others train."""
    rec = _one_round_with_node_config(102, "device", "cuda")  # node 102 holds partition 2
    assert [d["client"] for d in rec["dropped"]] == [2]
    assert "CUDA" in rec["dropped"][0]["reason"]
    assert rec["num_clients"] == 3


def test_min_results_fraction_makes_the_round_short():
    """0.9 of 4 clients: all 4 needed, 3 replied (a short round stops the run by default)."""
    cfg = tiny_config(
        rounds=1,
        threads=1,
        num_clients=4,
        clients_per_round=4,
        flower={"round_timeout": 0.3, "poll_interval": 0.05, "min_results": 0.9},
    )
    with pytest.raises(ShortRoundError, match=r"fewer than flower\.min_results \(4\)") as e:
        on_flower(cfg, {"silent": {101}})
    assert (e.value.reported, e.value.selected, e.value.required) == (3, 4, 4)


def test_personalized_evaluation_is_refused_on_flower():
    with pytest.raises(ConfigError, match="personalized"):
        tiny_config(algorithm="fedper", evaluation="personalized", executor="flower-simulation")


def test_a_node_that_lost_its_state_is_recorded_and_starts_fresh():
    cfg = tiny_config(
        algorithm="feddyn", rounds=2, threads=1, num_clients=3, clients_per_round=3
    ).model_copy(update={"executor": "flower-simulation"})
    run_config = {"config": json.dumps(cfg.model_dump(mode="json"))}
    grid = LoopbackGrid(client_app, 3, run_config)

    class Forgetful(FlowerExecutor):
        def stream_round(self, weights, tasks, states):
            if tasks[0].round == 2:  # node 101 restarted: its context.state is empty
                grid.contexts[101].state = type(grid.contexts[101].state)()
            return super().stream_round(weights, tasks, states)

    with task_identity():
        res = run_experiment(cfg, executor_factory=lambda e: Forgetful(grid, e, map_once=True))
    first, second = res.records
    assert "state_reset" not in first
    assert second["state_reset"] == [1]


def test_a_pool_of_fewer_nodes_than_clients_trains_every_client_as_in_process(tmp_path):
    """The simulation's nodes are a pool (``pooled-nodes``): 2 nodes serve 5 clients (client c
    on the node of partition c mod 2), FedDyn's client states on their shared disk, with the
    in-process numbers; without the pool the clients no node holds are dropped."""
    base = tiny_config(algorithm="feddyn", rounds=3, threads=1, num_clients=5, clients_per_round=3)
    here = run_experiment(base)
    cfg = base.model_copy(update={"executor": "flower-simulation"})
    text = json.dumps(cfg.model_dump(mode="json"))
    # as the simulation fedbug starts: client states on the pool's shared disk
    run_config = {"config": text, "pooled-nodes": True, "node-state-dir": str(tmp_path)}
    grid = LoopbackGrid(client_app, 2, run_config)
    with task_identity():
        there = run_experiment(
            cfg, executor_factory=lambda e: FlowerExecutor(grid, e, map_once=True, pooled=True)
        )
    assert without_timing(there.records) == without_timing(here.records)
    assert torch.equal(there.weights, here.weights)
    trained_on = {s.metadata.dst_node_id for s in grid.sent if s.metadata.message_type == "train"}
    assert trained_on == {100, 101}
    # without the pool a round may find none of its clients held: skip such rounds to see why
    skipping = cfg.model_copy(update={"on_short_round": "skip"})
    strict = LoopbackGrid(client_app, 2, {"config": json.dumps(skipping.model_dump(mode="json"))})
    with task_identity():
        alone = run_experiment(
            skipping, executor_factory=lambda e: FlowerExecutor(strict, e, map_once=True)
        )
    dropped = {d["client"] for r in alone.records for d in r.get("dropped", [])}
    assert dropped and dropped <= {2, 3, 4}


def exp_task(exp, client):
    from fedbug.engine.client import ClientTask

    return ClientTask(1, client, exp.cfg.seed, exp.cfg.lr, exp.mean_samples, {}, 1, {})


class Trickle(LoopbackGrid):
    """Each pull hands back at most one reply, the lowest client's first, as nodes that finish
    one after another; counts the pulls and keeps each TRAIN message's weights record."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.pulls = 0
        self.weights_records = []

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            if m.metadata.message_type == "train":
                self.weights_records.append(m.content.array_records["weights"])
        return super().push_messages(messages)

    def pull_messages(self, message_ids):
        self.pulls += 1
        ids = sorted(message_ids, key=lambda m: int(m[1:]))
        return super().pull_messages(ids[:1])


def test_updates_stream_in_client_order_as_they_arrive():
    """The executor yields client 0's update after the pull that brought it, before the later
    clients' replies are pulled; the round's TRAIN messages share one weights record."""
    from fedbug.engine.experiment import Experiment

    cfg = tiny_config(rounds=1, threads=1, num_clients=3, clients_per_round=3)
    cfg = cfg.model_copy(update={"executor": "flower-simulation"})
    run_config = {"config": json.dumps(cfg.model_dump(mode="json"))}
    grid = Trickle(client_app, 3, run_config)
    exp = Experiment(cfg)
    ex = FlowerExecutor(grid, exp, map_once=True)
    with task_identity():
        ex.map_nodes()
        before = grid.pulls
        tasks = [exp_task(exp, c) for c in (2, 0, 1)]
        stream = ex.stream_round(exp.initial_weights(), tasks, {})
        first = next(stream)
        assert first.client == 0 and grid.pulls == before + 1
        rest = list(stream)
    assert [r.client for r in rest] == [1, 2] and grid.pulls == before + 3
    assert len(grid.weights_records) == 3
    assert all(w is grid.weights_records[0] for w in grid.weights_records)


class Held(LoopbackGrid):
    """Client 1's reply stays out of reach until ``release`` is set."""

    release = False

    def pull_messages(self, message_ids):
        got = list(super().pull_messages(message_ids))
        result = [m.content.config_records.get("result") for m in got]
        keep = [m for m, r in zip(got, result) if self.release or not r or r["client"] != 1]
        for m in got:
            if m not in keep:  # not yet: back where it was
                self.replies[m.metadata.reply_to_message_id] = m
        return keep


def test_a_reply_that_came_while_the_server_aggregated_past_the_deadline_is_taken():
    """The server aggregates client 0's update until after the round's deadline; client 1's
    reply came in meanwhile. One last pull takes it rather than dropping it as late."""
    import time

    from fedbug.engine.experiment import Experiment

    cfg = tiny_config(
        rounds=1,
        threads=1,
        num_clients=2,
        clients_per_round=2,
        flower={"round_timeout": 0.3, "poll_interval": 0.05},
    ).model_copy(update={"executor": "flower-simulation"})
    grid = Held(client_app, 2, {"config": json.dumps(cfg.model_dump(mode="json"))})
    exp = Experiment(cfg)
    ex = FlowerExecutor(grid, exp, map_once=True)
    with task_identity():
        stream = ex.stream_round(exp.initial_weights(), [exp_task(exp, c) for c in (0, 1)], {})
        assert next(stream).client == 0
        time.sleep(0.4)  # aggregating client 0 past the deadline
        grid.release = True
        assert [r.client for r in stream] == [1]
    assert ex.lost() == []
