"""``flower.secagg``: rounds summed by Flower's own SecAgg+ give the plain aggregate within the
quantisation bound, layer by layer for partial uploads, and the server sees no update.

The bound (``SecAggParams.sum_bound``): SecAgg+ clips each sent value to [-c, c] and rounds
(x + c) Q / (2c) stochastically to an integer, so each client moves each value by less than one
level, step = 2c/Q; a sum over n clients is off by less than n * step. The per-unit weights and
counts are sums of integers, recovered exactly; so a unit's mean update, sum_i w_i Delta_i /
sum_i w_i, is off by less than n * step * s / W_u (s = max_weight under weighting: samples, where
the vector carries w_i / max_weight, else 1; W_u the unit's exact weight).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("flwr")

from flowergrid import Deployment, LoopbackGrid, only_run, run_records, task_identity  # noqa: E402
from tiny import method_needs, tiny_config  # noqa: E402

from fedbug.cli import main  # noqa: E402
from fedbug.config import config_hash  # noqa: E402
from fedbug.engine import run_experiment  # noqa: E402
from fedbug.engine.aggregate import Aggregate  # noqa: E402
from fedbug.errors import ConfigError, DivergenceError, ShortRoundError  # noqa: E402
from fedbug.integrations.flower.clientapp import app as client_app  # noqa: E402
from fedbug.integrations.flower.executor import FlowerExecutor  # noqa: E402
from fedbug.integrations.flower.secagg import SecAggExecutor  # noqa: E402
from fedbug.integrations.flower.secagg_params import SecAggParams  # noqa: E402


class PlainAggregates(FlowerExecutor):
    """The plain executor; each round's aggregate rebuilt from the updates it received."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.aggs: list[Aggregate] = []
        self.results: list = []

    def stream_round(self, weights, tasks, states):
        exp = self.exp
        agg = Aggregate(exp.space, exp.cfg.weighting)
        agg.of_abs = Aggregate(exp.space, exp.cfg.weighting)  # of |delta|: float32's error
        self.aggs.append(agg)
        shared = exp.algorithm.shared_mask(exp.space.num_units)
        for res in super().stream_round(weights, tasks, states):
            sent = res.uploaded if exp.cfg.upload == "partial" else shared
            agg.add(res.delta, sent, res.num_samples, extras=res.extras)
            agg.of_abs.add(res.delta.abs(), sent, res.num_samples)
            self.results.append(res)
            yield res


class SecureAggregates(SecAggExecutor):
    """The secure executor, keeping each round's aggregate."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.aggs: list[Aggregate] = []

    def round_aggregate(self):
        agg = super().round_aggregate()
        self.aggs.append(agg)
        return agg


class SeesReplies(LoopbackGrid):
    """A loopback grid that keeps every reply the server pulls."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.seen: list = []

    def pull_messages(self, message_ids):
        out = super().pull_messages(message_ids)
        self.seen.extend(out)
        return out


class DropsAtStage(LoopbackGrid):
    """A loopback grid whose node ``dead`` never answers SecAgg+'s stage ``stage``."""

    def __init__(self, *a, dead: int, stage: str, **k):
        super().__init__(*a, **k)
        self.dead, self.stage = dead, stage

    def push_messages(self, messages):
        ids = []
        for m in messages:
            cfg = m.content.config_records.get("secaggplus_configs")
            gone = m.metadata.dst_node_id == self.dead and cfg and cfg.get("stage") == self.stage
            self.silent = {self.dead} if gone else set()
            ids += list(super().push_messages([m]))
        self.silent = set()
        return ids


def run_on(
    cfg, executor, grid_cls=LoopbackGrid, *, pooled=False, nodes=None, run=None, **grid_kwargs
):
    """``cfg`` on a loopback grid of ``nodes`` nodes (one a client by default); ``run``: more
    arguments of ``run_experiment``. (result, executor, grid)."""
    run_config = {"config": json.dumps(cfg.model_dump(mode="json")), "pooled-nodes": pooled}
    grid = grid_cls(client_app, nodes or cfg.num_clients, run_config, **grid_kwargs)
    made = []

    def factory(exp):
        made.append(executor(grid, exp, map_once=True, pooled=pooled))
        return made[0]

    with task_identity():
        res = run_experiment(cfg, executor_factory=factory, **(run or {}))
    return res, made[0], grid


def config(secagg=None, **overrides):
    """CoCoFL on uniform system abilities: slow clients send fewer units (a partial upload)."""
    doc = {
        "executor": "flower-simulation",
        "rounds": 1,
        "threads": 1,
        "clients_per_round": 4,
        "policy": "cocofl",
        "upload": "partial",
        "aggregation": "layerwise",
        "weighting": "samples",
        **method_needs("cocofl"),
        "count_flops": True,
    }
    doc.update(overrides)
    if secagg is not None:
        doc["flower"] = {**doc.get("flower", {}), "secagg": secagg}
    return tiny_config(**doc)


def excess(secure: Aggregate, plain: Aggregate, sa: SecAggParams, n: int) -> float:
    """The largest |secure - plain| of a unit's mean update over its bound (<= 1: within): the
    quantisation bound, plus the float32 rounding of the plain sum (at most (n + 2) eps times
    the weighted sum of the |terms|, over the unit's weight)."""
    scale = sa.max_weight if plain.weighting == "samples" else 1.0
    diff = (secure.mean_delta() - plain.mean_delta()).abs()
    magnitude = plain.of_abs.mean_delta()
    worst = 0.0
    for u, s in enumerate(plain.space.unit_slices):
        w = plain.units_trained_by()[u]
        if w == 0:
            assert float(diff[s].max()) == 0.0
            continue
        rounding = (n + 2) * torch.finfo(torch.float32).eps * magnitude[s]
        bound = sa.sum_bound(n) * scale / w + rounding
        worst = max(worst, float((diff[s] / bound).max()))
    return worst


@pytest.fixture(scope="module")
def plain():
    res, ex, _ = run_on(config(), PlainAggregates)
    return res, ex


def test_partial_upload_aggregates_layer_by_layer_within_the_bound(plain, recwarn):
    _, pex = plain  # plain[0]: its run
    sa_cfg = config(secagg={})
    res, sex, grid = run_on(sa_cfg, SecureAggregates, SeesReplies)
    p, s = pex.aggs[0], sex.aggs[0]
    uploads = {r.client: (r.uploaded, r.num_samples) for r in pex.results}
    assert any(not all(up) for up, _ in uploads.values()), "no client sent a partial upload"
    # each unit's weight: the samples of the clients that sent it, exactly (hand count)
    for u in range(p.space.num_units):
        expected = sum(n for up, n in uploads.values() if up[u])
        assert s.units_trained_by()[u] == p.units_trained_by()[u] == expected
    assert s.count == p.count == len(uploads)
    assert 0 < excess(s, p, sa_cfg.flower.secagg, len(uploads)) <= 1.0
    # the squared norms and the losses go as two values each (on the grid, and the remainder
    # times Q): within n 2c/Q^2 of their sums, scaled back (D c for a norm, c for a loss)
    sa, n, total = sa_cfg.flower.secagg, len(uploads), p.space.total
    fine = n * sa.step / sa.quantization_range
    assert abs(s.sq_norm_sum - p.sq_norm_sum) <= fine * total * sa.clipping_range + 1e-12
    plain_loss = plain[0].records[0]["train_loss"]
    assert abs(res.records[0]["train_loss"] - plain_loss) <= fine * sa.clipping_range + 1e-12
    # the server saw no array of any client's: every reply's arrays came back empty
    trains = [m for m in grid.seen if m.metadata.message_type == "train"]
    assert len(trains) == 4 * len(uploads)  # SecAgg+'s four stages
    assert all(len(a) == 0 for m in trains for a in m.content.array_records.values())
    assert not [w for w in recwarn if "clipping_range" in str(w.message)]


def test_a_coarse_quantisation_breaks_the_bound(plain):
    """The check above can fail: 64 levels over [-8, 8] are far outside the default bound
    (while still within their own)."""
    _, pex = plain
    coarse = config(secagg={"quantization_range": 64})
    _, sex, _ = run_on(coarse, SecureAggregates)
    p, s = pex.aggs[0], sex.aggs[0]
    assert excess(s, p, SecAggParams(), p.count) > 100.0
    assert excess(s, p, coarse.flower.secagg, p.count) <= 1.0


def test_residual_sums_within_step_over_q(plain):
    """``residual``: each value as its grid point (passed exactly) and its remainder times Q;
    the per-unit means are then within float32's rounding of the plain ones."""
    res_plain, pex = plain
    cfg = config(secagg={"residual": True})
    res, sex, _ = run_on(cfg, SecureAggregates)
    p, s = pex.aggs[0], sex.aggs[0]
    assert excess(s, p, cfg.flower.secagg, 4) <= 1.0
    assert excess(s, p, SecAggParams(), 4) < 0.05  # far inside the one-level bound
    a, b = res_plain.records[0], res.records[0]
    assert b["test_acc"] == a["test_acc"]
    assert b["test_loss"] == pytest.approx(a["test_loss"], abs=1e-6)
    with pytest.raises(ConfigError, match="powers of 2"):
        config(secagg={"residual": True, "clipping_range": 10.0})


def test_a_resumed_secure_run_gives_the_uninterrupted_numbers(tmp_path):
    """The stochastic rounding is seeded by the task: a run stopped after round 1 and resumed
    (fresh nodes, fresh SecAgg+ keys) ends with the uninterrupted run's weights, bit for bit."""
    cfg = config(secagg={}, rounds=2, **PLAIN_FEDAVG)
    whole, _, _ = run_on(cfg, SecureAggregates)
    run_on(cfg, SecureAggregates, run={"run_dir": tmp_path / "r", "stop_after": 1})
    resumed, _, _ = run_on(cfg, SecureAggregates, run={"run_dir": tmp_path / "r", "resume": True})
    assert torch.equal(resumed.weights, whole.weights)


def test_values_beyond_the_clipping_range_are_counted_and_warned_of(plain):
    _, pex = plain
    cfg = config(secagg={"clipping_range": 1e-3})
    with pytest.warns(UserWarning, match=r"were clipped.*raise flower.secagg.clipping_range"):
        _, sex, _ = run_on(cfg, SecureAggregates)
    assert sex.aggs[0].clipped > 100
    assert excess(sex.aggs[0], pex.aggs[0], cfg.flower.secagg, 4) > 1.0


def test_uniform_weighting_and_extras_are_summed_and_runs_repeat():
    """SCAFFOLD's control-variate change is summed too; the stochastic rounding is seeded by
    the task, so the same config gives the same secure run twice."""
    base = dict(policy="none", upload="full", weighting="uniform", algorithm="scaffold")
    base |= dict(rounds=2, count_flops=False, system=None)
    _, pex, _ = run_on(config(**base), PlainAggregates)
    cfg = config(secagg={}, **base)
    a, sex, _ = run_on(cfg, SecureAggregates)
    b, _, _ = run_on(cfg, SecureAggregates)
    assert torch.equal(a.weights, b.weights)
    p, s = pex.aggs[0], sex.aggs[0]
    assert excess(s, p, cfg.flower.secagg, p.count) <= 1.0
    assert s.extra_count("c_delta") == p.extra_count("c_delta") == 4
    bound = cfg.flower.secagg.sum_bound(4)
    assert float((s.extra_sum("c_delta") - p.extra_sum("c_delta")).abs().max()) <= bound * 1.01


@pytest.mark.parametrize("stage", ["collect_masked_vectors", "unmask"])
def test_a_client_lost_mid_protocol(plain, stage):
    """Client 3 (node 103, the partial upload) goes silent: before sending its masked vector,
    it is dropped, and SecAgg+ rebuilds its pairwise masks from its neighbours' shares to unmask
    the others' sum; after it, its vector stays in the sum (its own mask rebuilt from shares)."""
    _, pex = plain
    cfg = config(secagg={})
    grid = {"dead": 103, "stage": stage}
    res, sex, _ = run_on(cfg, SecureAggregates, DropsAtStage, **grid)
    rec = res.records[0]
    if stage == "unmask":
        assert rec["clients"] == [0, 1, 3, 4] and "dropped" not in rec
        p = pex.aggs[0]
    else:
        assert rec["clients"] == [0, 1, 4]
        assert rec["dropped"][0]["client"] == 3
        assert "no masked vector" in rec["dropped"][0]["reason"]
        quick = {"round_timeout": 0.5, "poll_interval": 0.05}  # the plain run waits for it
        _, without, _ = run_on(config(flower=quick), PlainAggregates, silent={103})
        p = without.aggs[0]
    assert excess(sex.aggs[0], p, cfg.flower.secagg, len(rec["clients"])) <= 1.0


def test_a_pool_of_nodes_serves_each_client_on_its_own_node(plain):
    """The simulation's pool: the round's i-th client on the i-th node (4 nodes, 6 clients)."""
    _, pex = plain
    cfg = config(secagg={})
    res, sex, grid = run_on(cfg, SecureAggregates, SeesReplies, pooled=True, nodes=4)
    assert res.records[0]["clients"] == [0, 1, 3, 4]
    assert excess(sex.aggs[0], pex.aggs[0], cfg.flower.secagg, 4) <= 1.0


PLAIN_FEDAVG = dict(policy="none", upload="full", system=None, count_flops=False)


@pytest.mark.parametrize("algorithm", ["fjord", "apf", "heterofl", "fedrolex", "slt"])
def test_a_sub_model_is_refused_before_the_run(algorithm):
    """FjORD, APF and the width methods send a subset of each unit's entries; SecAgg+ sums
    whole units, so the config is refused in one line before anything starts."""
    doc = {**PLAIN_FEDAVG, **method_needs(algorithm), "algorithm": algorithm, "upload": "partial"}
    with pytest.raises(ConfigError, match=f"{algorithm} sends a sub-model") as e:
        config(secagg={}, **doc)
    assert "\n" not in str(e.value)


def test_a_sub_model_that_reaches_a_node_is_refused_there(monkeypatch):
    """The node's own guard, should a config get past: the short round says why."""
    monkeypatch.setattr("fedbug.config.secagg.secagg_incompatibility", lambda cfg: None)
    monkeypatch.setattr("fedbug.config.compat.secagg_incompatibility", lambda cfg: None)
    doc = {**PLAIN_FEDAVG, **method_needs("fjord"), "algorithm": "fjord", "upload": "partial"}
    with pytest.raises(ShortRoundError, match="fjord sends a sub-model"):
        run_on(config(secagg={}, **doc), SecureAggregates)


def test_a_non_finite_update_stops_the_run_naming_its_client():
    """A diverged client sends zeros and says so in the clear: the run stops as in the clear."""
    with pytest.raises(DivergenceError, match="client 0's update has non-finite weights"):
        run_on(config(secagg={}, lr=1e6, **PLAIN_FEDAVG), SecureAggregates)


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"executor": "sequential"}, "executor sequential does not use"),
        ({"dp": {"clip": 1.0}, "weighting": "uniform"}, "dp: clips each update"),
        ({"record_updates": [1]}, "record_updates"),
        ({"selection": "reputation"}, "selection reputation"),
        ({"evaluation": "mean_of_local_models"}, "mean_of_local_models"),
        ({"clients_per_round": 1}, "at least 2 clients"),
        ({"flower": {"supernodes": 3}}, "set flower.supernodes: 4"),
    ],
)
def test_configs_it_cannot_serve_are_refused_in_one_line(overrides, words):
    with pytest.raises(ConfigError) as e:
        config(secagg={}, **{**PLAIN_FEDAVG, **overrides})
    assert words in str(e.value)
    assert "\n" not in str(e.value)


def test_the_quantisation_has_its_own_run_folder_hash():
    plain, secure = config(**PLAIN_FEDAVG), config(secagg={}, **PLAIN_FEDAVG)
    wider = config(secagg={"num_shares": 5, "timeout": 9.0}, **PLAIN_FEDAVG)
    coarse = config(secagg={"quantization_range": 2**16}, **PLAIN_FEDAVG)
    assert config_hash(secure) not in (config_hash(plain), config_hash(coarse))
    assert config_hash(wider) == config_hash(secure)  # the masks cancel exactly


def test_a_modulus_the_sums_overflow_is_refused():
    with pytest.raises(ConfigError, match="overflow modulus_range"):
        config(secagg={"quantization_range": 2**30}, policy="none", system=None)
    with pytest.raises(ConfigError, match="power of 2"):
        config(secagg={"modulus_range": 3 * 2**20})
    with pytest.raises(ConfigError, match="quantization_range"):
        config(secagg={"quantization_range": 2**31})  # past SecAgg+'s int32


SMOKE = Path(__file__).resolve().parents[2] / "configs" / "flower-smoke.yaml"


@pytest.mark.slow
def test_a_loopback_deployment_sums_with_secagg(tmp_path):
    """A SuperLink and 3 SuperNodes (each its own process, served by a warm worker: SecAgg+'s
    stages are several messages a round, each a new ClientApp process otherwise): the smoke
    config (FedDyn, partial uploads of the head) summed by SecAgg+ gives the in-process
    records within the bound."""
    d = Deployment(tmp_path / "flower")
    try:
        d.start_superlink()
        for i in range(3):
            d.start_supernode(i, 3, warm=True)
        d.wait_for_nodes(3)
        flags = ["-s", "num_clients=3", "-s", "clients_per_round=3", "-s", "rounds=2"]
        assert main(["run", str(SMOKE), *flags, "--out", str(tmp_path / "here"), "-q"]) == 0
        remote = ["executor=flower-deployment", f"flower.superlink={d.address}"]
        remote += ["flower.secagg.num_shares=3", "flower.round_timeout=60"]
        remote = [x for s in remote for x in ("-s", s)]
        there = ["run", str(SMOKE), *flags, *remote, "--out", str(tmp_path / "there"), "-q"]
        assert main(there) == 0
    finally:
        assert d.stop() == [], "a Flower process outlived the test"
    here, there = (run_records(only_run(tmp_path / x)) for x in ("here", "there"))
    for a, b in zip(here, there, strict=True):
        assert a["clients"] == b["clients"] == [0, 1, 2] and "dropped" not in b
        assert b["test_loss"] == pytest.approx(a["test_loss"], abs=1e-4)
        assert b["train_loss"] == pytest.approx(a["train_loss"], abs=1e-4)


def test_freezefl_partial_upload_sums_layer_by_layer_within_the_bound():
    """FreezeFL itself (its probe epoch, n* from Eq. 2's importances, layer-wise partial
    upload; a soft deadline T0 that makes stragglers of some clients in the first round;
    uniform selection, since its reputation selection reads each client's figures): SecAgg+'s
    per-unit means equal the plain ones within the bound, each unit's weight exactly."""
    cfg = dict(
        policy="freezefl",
        freezefl={"T0": 0.5},
        local_epochs=2,
        local_steps=None,
        **method_needs("freezefl"),
    )
    _, pex, _ = run_on(config(**cfg), PlainAggregates)
    sa_cfg = config(secagg={}, **cfg)
    _, sex, _ = run_on(sa_cfg, SecureAggregates)
    p, s = pex.aggs[0], sex.aggs[0]
    uploads = {r.client: (r.uploaded, r.num_samples) for r in pex.results}
    assert any(not all(up) for up, _ in uploads.values()), "no client froze a unit"
    assert any(all(up) for up, _ in uploads.values()), "every client froze a unit"
    for u in range(p.space.num_units):
        expected = sum(k for up, k in uploads.values() if up[u])
        assert s.units_trained_by()[u] == p.units_trained_by()[u] == expected
    assert 0 < excess(s, p, sa_cfg.flower.secagg, p.count) <= 1.0
