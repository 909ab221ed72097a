"""HeteroFL (static width sub-models): a local step is the narrow network's, rates by hand, the
per-entry mean over holders (label rows included), evaluation at full width, refusals."""

import pytest
import torch
import torch.nn.functional as F
from executor_checks import assert_same_run, flower_run
from test_width_planner import TinyResNet
from tiny import tiny_config

from fedbug.algorithms.width.heterofl import HeteroFL, HeteroFLParams, assign_rates, draw_rate
from fedbug.core.units import ParamSpace, find_units, traced_module_order
from fedbug.engine import Experiment, run_experiment
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.engine.simulation import Simulation
from fedbug.errors import ConfigError
from fedbug.policies import build_policy

SGD = TrainSettings(
    local_steps=1,
    batch_size=4,
    momentum=0.9,
    weight_decay=0.01,
    clip_grad_norm=1.0,
    count_flops=False,
)


def runtime(model, example, settings=SGD, **params):
    alg = HeteroFL(params=HeteroFLParams(**params))
    wrapped = alg.wrap_model(model, traced_module_order(model, example)[-1])
    space = ParamSpace(wrapped, find_units(wrapped, example))
    rt = ClientRuntime(wrapped, space, build_policy("none"), alg, settings, lambda x: x)
    return rt, space.flatten(wrapped)


def task(width, round=1, client=0, lr=0.1):
    return ClientTask(round, client, 0, lr, 1.0, extra={"width": width})


def copy_narrow(full, narrow):
    """The narrow network holds the first channels' weights (c1 = 2 of 4, c2 = 4 of 8)."""
    keep = {3: 3, 4: 2, 8: 4}  # full size -> kept (ceil(0.5 K); the image's 3 stay)
    with torch.no_grad():
        for name, p in narrow.named_parameters():
            w = full.get_parameter(name)
            if name.startswith("linear"):  # every class row, the kept features
                p.copy_(w[:, :4] if w.dim() == 2 else w)
                continue
            idx = tuple(slice(0, keep[s]) for s in w.shape[:2])
            p.copy_(w[idx])


def narrow_step(net, x, y, present, settings=SGD, lr=0.1):
    """One step of the authors' Local.train: masked logits, cross-entropy, clip 1, SGD."""
    opt = torch.optim.SGD(
        net.parameters(), lr=lr, momentum=settings.momentum, weight_decay=settings.weight_decay
    )
    out = net(x)
    if present is not None:
        out = out.masked_fill(~present, 0.0)
    F.cross_entropy(out, y).backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), settings.clip_grad_norm)
    opt.step()


# -- one local step at rate 0.5 is the narrow network's ----------------------------------------
@pytest.mark.parametrize(
    ("norm", "scaler", "masked_loss"),
    [(True, True, True), (True, False, True), (True, True, False), (False, True, True)],
)
def test_one_step_at_half_width_equals_the_narrow_resnet(norm, scaler, masked_loss):
    """The narrow network divides by the rate where the authors' Scaler sits (before each
    norm, on the residual sum); fedbug divides each narrowed layer's output: the same step,
    with BatchNorm or (norm: none) without, where the Scaler matters most."""
    torch.manual_seed(1)
    full = TinyResNet(norm=norm)
    narrow = TinyResNet(2, 4, rate=0.5 if scaler else 1.0, norm=norm)
    copy_narrow(full, narrow)
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 0, 1])  # class 2: no sample
    rt, w0 = runtime(full, x[:1], scaler=scaler, masked_loss=masked_loss)
    res = train_client(w0, task(0.5), ClientData(x, y), {}, rt)
    narrow_step(narrow, x, y, torch.tensor([True, True, False]) if masked_loss else None)
    after = rt.space.state_dict(w0 + res.delta)
    before = rt.space.state_dict(w0)
    for name, p in narrow.named_parameters():
        got = after[f"model.{name}"]
        idx = (slice(0, p.shape[0]), slice(0, p.shape[1])) if p.dim() > 1 else slice(0, len(p))
        if name.startswith("linear"):  # row 2 is not sent (label split): its update is 0
            torch.testing.assert_close(got[:2, :4] if p.dim() > 1 else got[:2], p[:2])
            assert torch.equal(got[2], before[f"model.{name}"][2])
            continue
        torch.testing.assert_close(got[idx], p, atol=1e-6, rtol=0)
    # outside the sub-model nothing moved, weight decay and momentum notwithstanding
    assert torch.equal(
        after["model.layer2.conv1.weight"][4:], before["model.layer2.conv1.weight"][4:]
    )
    assert torch.equal(after["model.linear.weight"][:, 4:], before["model.linear.weight"][:, 4:])
    held = rt.algorithm.flat_mask(rt.space, 0.5)
    assert torch.equal(res.delta[~res.entries], torch.zeros(int((~res.entries).sum())))
    assert int(held.sum() - res.entries.sum()) == 4 + 1  # linear row 2 (4 kept columns) + bias
    assert rt.model.active is None and rt.model.scale == 1.0  # back to the full model


def test_scaler_and_masked_loss_change_the_step():
    torch.manual_seed(1)
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 0, 1])
    deltas = {}
    for scaler, masked in [(True, True), (False, True), (True, False)]:
        torch.manual_seed(1)
        rt, w0 = runtime(TinyResNet(norm=False), x[:1], scaler=scaler, masked_loss=masked)
        deltas[scaler, masked] = train_client(w0, task(0.5), ClientData(x, y), {}, rt).delta
    assert not torch.equal(deltas[True, True], deltas[False, True])
    assert not torch.equal(deltas[True, True], deltas[True, False])


def test_floor_rounding_keeps_fewer_channels():
    torch.manual_seed(0)
    model = TinyResNet(c1=6, c2=6)
    x = torch.zeros(1, 3, 8, 8)
    ceil, _ = runtime(model, x)
    floor, _ = runtime(TinyResNet(c1=6, c2=6), x, rounding="floor")
    # rate 0.25 of 6 channels: ceil 2, floor max(int(1.5), 1) = 1
    assert ceil.algorithm.index_sets(0.25)["conv1"].tolist() == [0, 1]
    assert floor.algorithm.index_sets(0.25)["conv1"].tolist() == [0]


# -- rates ----------------------------------------------------------------------------------
def test_fixed_rates_by_hand():
    five = [(1.0, 1), (0.5, 1), (0.25, 1), (0.125, 1), (0.0625, 1)]
    # 12 clients, 5 shares: 2 per share, the 2 left over take the last rate
    assert (
        assign_rates(range(12), five) == [1, 1, 0.5, 0.5, 0.25, 0.25, 0.125, 0.125] + [0.0625] * 4
    )
    # a1-b4 on 7 clients: 7 // 5 = 1 client per share, 2 left over at rate b
    assert assign_rates(range(7), [(1.0, 1), (0.5, 4)]) == [1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    # fewer clients than shares: everyone takes the last rate, as the authors' code does
    assert assign_rates(range(3), five) == [0.0625] * 3
    # by ability: clients 2, 0, 1, 3 fastest first
    assert assign_rates([2, 0, 1, 3], [(1.0, 1), (0.5, 1)]) == [1.0, 0.5, 1.0, 0.5]


def test_dynamic_draws_follow_the_shares_from_the_seed():
    table = [(1.0, 1), (0.5, 3)]
    draws = [draw_rate(table, 7, r, c) for r in range(1, 11) for c in range(40)]
    assert draws == [draw_rate(table, 7, r, c) for r in range(1, 11) for c in range(40)]
    assert 0.70 < draws.count(0.5) / len(draws) < 0.80  # 3/4 in expectation, 400 draws
    assert draws[:40] != draws[40:80]  # redrawn every round


def test_params_read_a_list_or_a_mapping():
    assert HeteroFLParams().table() == [(1.0, 1), (0.5, 1), (0.25, 1), (0.125, 1), (0.0625, 1)]
    assert HeteroFLParams(rates={1: 2, 0.5: 8}).table() == [(1.0, 2), (0.5, 8)]
    assert HeteroFLParams(rates={"1": 1, "0.25": 3}).table() == [(1.0, 1), (0.25, 3)]  # JSON


# -- through the engine -----------------------------------------------------------------------
SYSTEM = {"abilities": "uniform", "ability_min": 0.5, "ability_max": 3.0}


def _cfg(**kw):
    base = dict(
        method="heterofl",
        num_clients=10,
        clients_per_round=4,
        rounds=2,
        local_steps=None,
        local_epochs=1,
        batch_size=1000,  # one step an epoch: a client's FLOPs are n x the per-sample cost
        weighting="uniform",
        system=SYSTEM,
        count_flops=True,
    )
    base.update(kw)
    return tiny_config(**base)


# the tiny config's MLP on digits: 64 inputs, hidden (64, 32), 10 classes
SUB_PARAMS = {
    1.0: (64 * 64 + 64) + (64 * 32 + 32) + (32 * 10 + 10),  # 6570
    0.5: (64 * 32 + 32) + (32 * 16 + 16) + (16 * 10 + 10),  # 2778
    0.25: (64 * 16 + 16) + (16 * 8 + 8) + (8 * 10 + 10),  # 1266
    0.125: (64 * 8 + 8) + (8 * 4 + 4) + (4 * 10 + 10),  # 606
    0.0625: (64 * 4 + 4) + (4 * 2 + 2) + (2 * 10 + 10),  # 300
}


def test_heterofl_runs_with_rates_bytes_flops_and_time():
    cfg = _cfg()
    res = run_experiment(cfg)
    exp = Experiment(cfg)
    costs = res.summary["clients"]["width_costs"]
    assert list(costs) == ["1.0", "0.5", "0.25", "0.125", "0.0625"]
    assert costs["1.0"] == exp.system.per_sample[0]  # the full model's FLOPs
    seen = set()
    for rec in res.records:
        for c in rec["per_client"]:
            # 10 clients, 5 rates: ids 0-1 rate 1, 2-3 rate 0.5, ... (the fixed blocks)
            assert c["width"] == [1, 0.5, 0.25, 0.125, 0.0625][c["id"] // 2]
            assert c["bytes_up"] == c["bytes_down"] == 4 * SUB_PARAMS[c["width"]]
            assert c["flops"] == pytest.approx(exp.sizes[c["id"]] * costs[str(c["width"])])
            t = exp.system.time(c["id"], c["flops"], c["bytes_down"], c["bytes_up"])
            assert c["time"] == pytest.approx(t, rel=1e-12)
            seen.add(c["width"])
    assert len(seen) > 1


def test_engine_averages_each_entry_over_the_clients_holding_it():
    cfg = _cfg(rounds=1, heterofl={"rates": [1, 0.25]}, system=None, count_flops=False)
    res = run_experiment(cfg)
    exp = Experiment(cfg)
    w0 = exp.initial_weights()
    exp.algorithm.init_server_state(w0, exp.num_clients)  # as the engine does first
    sim, rt = Simulation(exp), exp.make_runtime()
    num = torch.zeros_like(w0, dtype=torch.float64)
    den = torch.zeros_like(w0, dtype=torch.float64)
    lacking = 0
    for i in exp.selection.select(1, cfg.seed, exp.num_clients):
        t = ClientTask(1, i, cfg.seed, cfg.lr, exp.mean_samples, {}, 1, sim.client_extra(i))
        out = train_client(w0, t, exp.client_data(i), {}, rt)
        held = exp.algorithm.flat_mask(exp.space, t.extra["width"])
        lacking += int((held & ~out.entries).sum())  # the classifier rows of absent classes
        num += out.delta.double() * out.entries.double()
        den += out.entries.double()
    assert {sim.client_extra(i)["width"] for i in range(10)} == {0.25, 1.0}
    assert lacking > 0  # digits' Dirichlet split leaves some client without some class
    expect = torch.where(den > 0, w0.double() + num / den.clamp_min(1), w0.double())
    torch.testing.assert_close(res.weights.double(), expect, atol=1e-6, rtol=0)


def test_dynamic_rates_are_drawn_on_the_client_each_round():
    res = run_experiment(_cfg(heterofl={"assign": "dynamic", "rates": {1: 1, 0.5: 1}}))
    widths = [{c["id"]: c["width"] for c in rec["per_client"]} for rec in res.records]
    for r, rec in enumerate(widths, start=1):
        for client, width in rec.items():
            assert width == draw_rate([(1.0, 1), (0.5, 1)], 0, r, client)


def test_by_ability_gives_the_fastest_clients_the_largest_rates():
    cfg = _cfg(heterofl={"assign": "by_ability", "rates": [0.5, 1]})
    res = run_experiment(cfg)
    ab = Experiment(cfg).system.abilities.tolist()
    fast = sorted(range(10), key=lambda k: -ab[k])[:5]
    for rec in res.records:
        for c in rec["per_client"]:
            assert c["width"] == (1.0 if c["id"] in fast else 0.5)


def test_evaluation_uses_the_full_model():
    cfg = _cfg()
    res = run_experiment(cfg)
    exp = Experiment(cfg)
    inner = exp.template.model
    state = {k.removeprefix("model."): v for k, v in exp.space.state_dict(res.weights).items()}
    inner.load_state_dict(state)
    with torch.no_grad():
        pred = inner(exp.dataset.prepare(exp.dataset.test_x)).argmax(1)
    acc = int((pred == exp.dataset.test_y).sum()) / len(exp.dataset.test_y)
    assert res.records[-1]["test_acc"] == pytest.approx(acc, abs=1e-9)


@pytest.mark.slow
def test_processes_executor_gives_the_in_process_numbers():
    cfg = _cfg(heterofl={"assign": "dynamic"}, threads=1)  # one thread: the same sums
    here = run_experiment(cfg)
    there = run_experiment(cfg.model_copy(update={"executor": "processes", "workers": 2}))
    assert_same_run(there, here)


def test_flowers_message_path_gives_the_in_process_numbers():
    """The rate travels in each task's config and the entries sent (label rows cut) in each
    reply: Flower's serialised messages give the in-process numbers bitwise."""
    cfg = tiny_config(algorithm="heterofl", threads=1, count_flops=False)
    here = run_experiment(cfg)
    assert_same_run(flower_run(cfg), here)


# -- refusals ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"heterofl": {"rates": [1, 1.5]}}, "every heterofl rate must be in (0, 1]"),
        ({"heterofl": {"rates": [1, 0.0]}}, "every heterofl rate must be in (0, 1]"),
        ({"heterofl": {"rates": [0.5, 0.25]}}, "1 must be one of them"),
        ({"heterofl": {"rates": []}}, "needs at least one rate"),
        ({"heterofl": {"rates": [1, 0.5, 0.5]}}, "lists a rate twice"),
        ({"heterofl": {"rates": {1: 1, 0.5: 0}}}, "shares must be whole numbers >= 1"),
        ({"heterofl": {"assign": "random"}}, "heterofl.assign"),
        ({"heterofl": {"rounding": "round"}}, "heterofl.rounding"),
        ({"heterofl": {"assign": "by_ability"}, "system": None}, "abilities: uniform or tiers"),
        ({"upload": "full"}, "use upload: partial"),
        ({"system": {**SYSTEM, "cost": "measured"}}, "system.cost: flops"),
    ],
)
def test_bad_settings_are_one_clear_config_error(override, needle):
    with pytest.raises(ConfigError) as e:
        _cfg(**override)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and msg.count(needle) == 1


def test_models_it_cannot_narrow_are_refused_naming_the_layer():
    cfg = _cfg(dataset="digits", model="resnet18", model_options={"stem": "cifar"})
    with pytest.raises(
        ConfigError, match="heterofl: cannot narrow ResNetGN: norm1 \\(GroupNorm\\)"
    ):
        Experiment(cfg)
