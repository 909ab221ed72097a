"""Fjord (ordered dropout, FreezeFL's baseline [13]): local steps, aggregation, widths, engine."""

import pytest
import torch
from test_od import ChainCNN
from tiny import TwoLayer, tiny_config

from fedbug.algorithms.fjord import Fjord, FjordClient, FjordParams, assign_widths
from fedbug.config import load_config
from fedbug.core.units import ParamSpace, find_units, traced_module_order
from fedbug.engine import Experiment, run_experiment
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.errors import ConfigError
from fedbug.models import ShakespeareLSTM
from fedbug.policies import build_policy

SYSTEM = {"abilities": "uniform", "ability_min": 0.5, "ability_max": 3.0}


def fjord_runtime(model, example, settings, **params):
    alg = Fjord(params=FjordParams(**params))
    wrapped = alg.wrap_model(model, traced_module_order(model, example)[-1])
    space = ParamSpace(wrapped, find_units(wrapped, example))
    weights = space.flatten(wrapped)
    rt = ClientRuntime(wrapped, space, build_policy("none"), alg, settings, lambda x: x)
    return rt, weights


def fjord_task(width, round=1, client=0, lr=0.1):
    return ClientTask(round, client, 0, lr, 1.0, extra={"width": width})


SGD = TrainSettings(local_steps=1, batch_size=4, momentum=0.9, weight_decay=0.01, count_flops=False)


# -- one local step at width p is training the narrower network -----------------------------
class NarrowCNN(torch.nn.Module):
    """ChainCNN at p = 0.5 written out by hand: conv 2 - conv 3 - FC (3*2*2 = 12) 5 - out 3."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 2, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(2, 3, 3, padding=1)
        self.fc1 = torch.nn.Linear(12, 5)
        self.fc2 = torch.nn.Linear(5, 3)
        self.pool = torch.nn.MaxPool2d(2)

    forward = ChainCNN.forward


def _step(model, x, y, settings, lr):
    opt = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=settings.momentum, weight_decay=settings.weight_decay
    )
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def test_one_step_at_half_width_equals_the_narrow_cnn():
    torch.manual_seed(1)
    full = ChainCNN()
    narrow = NarrowCNN()
    with torch.no_grad():  # the narrow network holds the first channels' weights
        narrow.conv1.weight.copy_(full.conv1.weight[:2])
        narrow.conv1.bias.copy_(full.conv1.bias[:2])
        narrow.conv2.weight.copy_(full.conv2.weight[:3, :2])
        narrow.conv2.bias.copy_(full.conv2.bias[:3])
        narrow.fc1.weight.copy_(full.fc1.weight[:5, :12])  # channels 0..2, 4 features each
        narrow.fc1.bias.copy_(full.fc1.bias[:5])
        narrow.fc2.weight.copy_(full.fc2.weight[:, :5])
        narrow.fc2.bias.copy_(full.fc2.bias)
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 1])
    rt, w0 = fjord_runtime(full, x[:1], SGD, sample="fixed")
    res = train_client(w0, fjord_task(0.5), ClientData(x, y), {}, rt)
    _step(narrow, x, y, SGD, 0.1)
    after = rt.space.state_dict(w0 + res.delta)
    before = rt.space.state_dict(w0)
    torch.testing.assert_close(
        after["model.conv1.weight"][:2], narrow.conv1.weight, atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        after["model.conv2.weight"][:3, :2], narrow.conv2.weight, atol=1e-6, rtol=0
    )
    torch.testing.assert_close(
        after["model.fc1.weight"][:5, :12], narrow.fc1.weight, atol=1e-6, rtol=0
    )
    torch.testing.assert_close(after["model.fc1.bias"][:5], narrow.fc1.bias, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        after["model.fc2.weight"][:, :5], narrow.fc2.weight, atol=1e-6, rtol=0
    )
    torch.testing.assert_close(after["model.fc2.bias"], narrow.fc2.bias, atol=1e-6, rtol=0)
    # outside the sub-model nothing moved, weight decay and momentum notwithstanding
    assert torch.equal(after["model.conv1.weight"][2:], before["model.conv1.weight"][2:])
    assert torch.equal(after["model.fc1.weight"][:, 12:], before["model.fc1.weight"][:, 12:])
    assert torch.equal(after["model.fc2.weight"][:, 5:], before["model.fc2.weight"][:, 5:])
    mask = rt.algorithm.flat_mask(rt.space, 0.5)
    assert torch.equal(res.delta[~mask], torch.zeros(int((~mask).sum())))
    assert rt.model.width is None  # back to the full model after training


def test_one_step_at_quarter_width_equals_the_narrow_lstm():
    torch.manual_seed(2)
    full = ShakespeareLSTM((6,), 10, embed_dim=4, hidden=8)
    narrow = ShakespeareLSTM((6,), 10, embed_dim=4, hidden=2)  # 2 = ceil(0.25 * 8) units
    rows = torch.tensor([0, 1, 8, 9, 16, 17, 24, 25])  # gates i, f, g, o of units 0, 1
    with torch.no_grad():
        narrow.embedding.weight.copy_(full.embedding.weight)
        narrow.lstm1.weight_ih_l0.copy_(full.lstm1.weight_ih_l0[rows])
        narrow.lstm1.weight_hh_l0.copy_(full.lstm1.weight_hh_l0[rows][:, :2])
        narrow.lstm1.bias_ih_l0.copy_(full.lstm1.bias_ih_l0[rows])
        narrow.lstm1.bias_hh_l0.copy_(full.lstm1.bias_hh_l0[rows])
        narrow.lstm2.weight_ih_l0.copy_(full.lstm2.weight_ih_l0[rows][:, :2])
        narrow.lstm2.weight_hh_l0.copy_(full.lstm2.weight_hh_l0[rows][:, :2])
        narrow.lstm2.bias_ih_l0.copy_(full.lstm2.bias_ih_l0[rows])
        narrow.lstm2.bias_hh_l0.copy_(full.lstm2.bias_hh_l0[rows])
        narrow.fc.weight.copy_(full.fc.weight[:, :2])
        narrow.fc.bias.copy_(full.fc.bias)
    x, y = torch.randint(0, 10, (4, 6)), torch.tensor([1, 3, 5, 7])
    rt, w0 = fjord_runtime(full, x[:1], SGD, sample="fixed")
    res = train_client(w0, fjord_task(0.25), ClientData(x, y), {}, rt)
    _step(narrow, x, y, SGD, 0.1)
    after = rt.space.state_dict(w0 + res.delta)
    got = {
        "lstm1.weight_ih_l0": after["model.lstm1.weight_ih_l0"][rows],
        "lstm1.weight_hh_l0": after["model.lstm1.weight_hh_l0"][rows][:, :2],
        "lstm2.weight_ih_l0": after["model.lstm2.weight_ih_l0"][rows][:, :2],
        "lstm2.bias_hh_l0": after["model.lstm2.bias_hh_l0"][rows],
        "fc.weight": after["model.fc.weight"][:, :2],
        "embedding.weight": after["model.embedding.weight"],
    }
    for name, value in got.items():
        torch.testing.assert_close(value, narrow.get_parameter(name), atol=1e-6, rtol=0)
    mask = rt.algorithm.flat_mask(rt.space, 0.25)
    assert torch.equal(res.delta[~mask], torch.zeros(int((~mask).sum())))


def test_entries_outside_the_steps_width_do_not_move_in_that_step(monkeypatch):
    torch.manual_seed(3)
    settings = TrainSettings(
        local_steps=12, batch_size=4, momentum=0.9, weight_decay=0.05, count_flops=False
    )
    rt, w0 = fjord_runtime(ChainCNN(), torch.zeros(1, 1, 8, 8), settings, sample="uniform")
    seen = []
    before_step, after_step = FjordClient.before_step, FjordClient.after_step

    def spy_before(self, x, y):
        before_step(self, x, y)
        seen.append([self.p, self.rt.flat.clone()])

    def spy_after(self):
        after_step(self)
        seen[-1].append(self.rt.flat.clone())

    monkeypatch.setattr(FjordClient, "before_step", spy_before)
    monkeypatch.setattr(FjordClient, "after_step", spy_after)
    data = ClientData(torch.randn(16, 1, 8, 8), torch.arange(16) % 3)
    train_client(w0, fjord_task(1.0), data, {}, rt)
    widths = [p for p, _, _ in seen]
    assert set(widths) <= {0.25, 0.5, 0.75, 1.0} and len(set(widths)) > 1
    assert any(p < 1.0 for p in widths[1:])  # a narrow step after momentum has built up
    for p, pre, post in seen:
        outside = ~rt.algorithm.flat_mask(rt.space, p)
        assert torch.equal(post[outside], pre[outside])
        assert not torch.equal(post[~outside], pre[~outside])


# -- sampling ------------------------------------------------------------------------------
def _widths_used(monkeypatch, sample, p_max, steps=20):
    rt, w0 = fjord_runtime(
        ChainCNN(),
        torch.zeros(1, 1, 8, 8),
        TrainSettings(local_steps=steps, batch_size=4, weight_decay=0.0, count_flops=False),
        sample=sample,
    )
    used = []
    before_step = FjordClient.before_step

    def spy(self, x, y):
        before_step(self, x, y)
        used.append(self.p)

    monkeypatch.setattr(FjordClient, "before_step", spy)
    data = ClientData(torch.randn(8, 1, 8, 8), torch.arange(8) % 3)
    train_client(w0, fjord_task(p_max, client=5), data, {}, rt)
    monkeypatch.undo()
    return used


def test_sample_fixed_uses_p_max_every_step(monkeypatch):
    assert _widths_used(monkeypatch, "fixed", 0.5) == [0.5] * 20


def test_sample_uniform_draws_widths_up_to_p_max_from_the_client_seed(monkeypatch):
    used = _widths_used(monkeypatch, "uniform", 0.75)
    assert set(used) == {0.25, 0.5, 0.75}  # 20 draws from 3 widths: all appear (this seed)
    assert _widths_used(monkeypatch, "uniform", 0.75) == used  # the same seeded stream
    assert _widths_used(monkeypatch, "uniform", 0.25) == [0.25] * 20


# -- widths by ability ---------------------------------------------------------------------
def test_widths_by_ability_groups():
    abilities = [3.0, 0.5, 1.0, 2.0, 0.7, 2.5, 1.5, 0.6]
    # sorted: 1 (0.5), 7 (0.6), 4 (0.7), 2 (1.0), 6 (1.5), 3 (2.0), 5 (2.5), 0 (3.0)
    got = assign_widths(abilities, [0.25, 0.5, 0.75, 1.0])
    assert got == [1.0, 0.25, 0.5, 0.75, 0.5, 1.0, 0.75, 0.25]
    # 5 clients, 2 widths: ranks 0..2 -> the small width (rank * 2 // 5), ranks 3, 4 -> 1
    assert assign_widths([5.0, 1.0, 4.0, 2.0, 3.0], [0.5, 1.0]) == [1.0, 0.5, 1.0, 0.5, 0.5]
    assert assign_widths([1.0, 1.0], [0.5, 1.0]) == [0.5, 1.0]  # ties: lower id is slower


# -- OD-aware aggregation ------------------------------------------------------------------
def test_od_aggregation_by_hand():
    m = TwoLayer()  # 12 entries: first.weight 0-3, first.bias 4-5, second.weight 6-9, bias 10-11
    space = ParamSpace(m, find_units(m, torch.zeros(1, 2)))
    agg = Aggregate(space, "samples")
    ones = torch.ones(12)
    held_a = torch.tensor([1, 0, 0, 0, 1, 0, 1, 0, 1, 0, 1, 1], dtype=torch.bool)  # "p = 0.5"
    held_b = torch.ones(12, dtype=torch.bool)  # p = 1
    held_c = held_a.clone()
    agg.add(2.0 * ones * held_a, [True, True], 10, held_a)
    agg.add(4.0 * ones * held_b, [True, True], 30, held_b)
    agg.add(8.0 * ones * held_c, [True, True], 20, held_c)
    mean = agg.mean_delta()
    # held by a, b, c: (10*2 + 30*4 + 20*8) / 60 = 5; held by b only: 4
    expect = torch.where(held_a, torch.tensor(300.0 / 60), torch.tensor(4.0))
    torch.testing.assert_close(mean, expect)
    assert torch.equal(agg.entries_held(), held_b)
    uniform = agg.mean_delta(uniform=True)
    torch.testing.assert_close(
        uniform, torch.where(held_a, torch.tensor(14.0 / 3), torch.tensor(4.0))
    )


def test_an_entry_no_client_holds_stays_bitwise_unchanged():
    m = TwoLayer()
    space = ParamSpace(m, find_units(m, torch.zeros(1, 2)))
    agg = Aggregate(space, "samples")
    held = torch.zeros(12, dtype=torch.bool)
    held[[0, 4, 6, 10, 11]] = True
    agg.add(torch.ones(12) * held, [True, True], 5, held)
    weights = torch.tensor(
        [0.5, -0.0, 1e-30, float("nan"), 1.0, 2.0, 3.0, -0.0, 1.0, 1.0, 1.0, 1.0]
    )
    step = Fjord(global_lr=1.0).server_update(weights, agg, {}, 1, 4)
    bits = step.weights.view(torch.int32)
    assert torch.equal(bits[~held], weights.view(torch.int32)[~held])  # -0.0 and nan too
    torch.testing.assert_close(step.weights[held], weights[held] + 1.0)


def test_aggregate_without_entry_masks_is_unchanged():
    m = TwoLayer()
    space = ParamSpace(m, find_units(m, torch.zeros(1, 2)))
    agg = Aggregate(space, "samples")
    agg.add(torch.ones(12), [True, False], 1)
    agg.add(3.0 * torch.ones(12), [True, True], 3)
    mean = agg.mean_delta()
    assert mean[:6].tolist() == [2.5] * 6 and mean[6:].tolist() == [3.0] * 6
    # an update naming its entries later counts the earlier ones as holding their units
    agg.add(torch.zeros(12), [True, True], 4, torch.zeros(12, dtype=torch.bool))
    assert agg.mean_delta()[:6].tolist() == [2.5] * 6


# -- through the engine --------------------------------------------------------------------
def _cfg(**kw):
    base = dict(
        method="fjord",
        num_clients=12,
        clients_per_round=4,
        local_steps=None,
        local_epochs=1,
        batch_size=16,
        rounds=2,
        system=SYSTEM,
    )
    base.update(kw)
    return tiny_config(**base)


# the tiny config's MLP on digits: 64 inputs, hidden (64, 32), 10 classes
SUB_PARAMS = {
    0.25: (64 * 16 + 16) + (16 * 8 + 8) + (8 * 10 + 10),  # 1266
    0.5: (64 * 32 + 32) + (32 * 16 + 16) + (16 * 10 + 10),  # 2778
    0.75: (64 * 48 + 48) + (48 * 24 + 24) + (24 * 10 + 10),  # 4546
    1.0: (64 * 64 + 64) + (64 * 32 + 32) + (32 * 10 + 10),  # 6570
}


def test_fjord_runs_and_records_width_bytes_and_time():
    cfg = _cfg()
    res = run_experiment(cfg)
    exp = Experiment(cfg)
    p_max = assign_widths(exp.system.abilities.tolist(), [0.25, 0.5, 0.75, 1.0])
    assert len(res.records) == 2
    for rec in res.records:
        assert rec["round_length"] == max(c["time"] for c in rec["per_client"])
        assert rec["bytes_up"] == sum(c["bytes_up"] for c in rec["per_client"])
        assert rec["bytes_down"] == sum(c["bytes_down"] for c in rec["per_client"])
        for c in rec["per_client"]:
            assert c["width"] == p_max[c["id"]]
            assert c["bytes_up"] == c["bytes_down"] == 4 * SUB_PARAMS[c["width"]]
            # time: the sub-model's bytes both ways and its counted FLOPs
            t = exp.system.time(c["id"], c["flops"], c["bytes_down"], c["bytes_up"])
            assert c["time"] == pytest.approx(t, rel=1e-12)
    widths = {c["width"] for rec in res.records for c in rec["per_client"]}
    assert len(widths) > 1
    costs = res.summary["clients"]["width_costs"]
    assert list(costs) == ["0.25", "0.5", "0.75", "1.0"]
    assert costs["0.25"] < costs["0.5"] < costs["0.75"] < costs["1.0"]
    assert costs["1.0"] == exp.system.per_sample[0]  # the full model's FLOPs


def test_sample_fixed_charges_e_epochs_of_the_width():
    cfg = _cfg(fjord={"sample": "fixed"}, local_epochs=2, batch_size=1000)
    res = run_experiment(cfg)
    exp = Experiment(cfg)
    for c in res.records[0]["per_client"]:
        n = exp.sizes[c["id"]]
        assert c["flops"] == pytest.approx(
            2 * n * exp.system_figures["width_costs"][str(c["width"])], rel=1e-9
        )


def test_evaluation_uses_the_full_model():
    cfg = _cfg()
    res = run_experiment(cfg)
    exp = Experiment(cfg)
    inner = exp.template.model  # the plain MLP, evaluated by hand with the final weights
    state = {k.removeprefix("model."): v for k, v in exp.space.state_dict(res.weights).items()}
    inner.load_state_dict(state)
    with torch.no_grad():
        pred = inner(exp.dataset.prepare(exp.dataset.test_x)).argmax(1)
    acc = int((pred == exp.dataset.test_y).sum()) / len(exp.dataset.test_y)
    assert res.records[-1]["test_acc"] == pytest.approx(acc, abs=1e-9)
    assert exp.template.width is None


def test_fjord_cs_passes_p_max_as_u_sys(monkeypatch):
    from fedbug.selection.reputation import Reputation

    seen = []
    update = Reputation.update

    def spy(self, feedback):
        seen.append({k: f["u_sys"] for k, f in feedback.figures.items()})
        update(self, feedback)

    monkeypatch.setattr(Reputation, "update", spy)
    res = run_experiment(_cfg(method="fjord_cs"))
    assert res.summary["config"]["selection"] == "reputation"
    for u_sys, rec in zip(seen, res.records):
        assert u_sys == {c["id"]: c["width"] for c in rec["per_client"]}
        assert all(c["utility"] is not None for c in rec["per_client"])


def test_presets():
    cfg = _cfg()
    assert (cfg.algorithm, cfg.selection, cfg.policy) == ("fjord", "uniform", "none")
    cs = _cfg(method="fjord_cs")
    assert (cs.selection, cs.reputation.warm_restart) == ("reputation", 0)
    assert _cfg(method="fjord_cs", reputation={"warm_restart": 5}).reputation.warm_restart == 5
    assert _cfg(fjord={"widths": [0.5, 1.0]}).fjord.widths == [0.5, 1.0]


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"fjord": {"widths": []}}, "needs at least one width"),
        ({"fjord": {"widths": [0.0, 1.0]}}, "in (0, 1]"),
        ({"fjord": {"widths": [0.5, 1.5]}}, "in (0, 1]"),
        ({"fjord": {"widths": [-0.25, 1.0]}}, "in (0, 1]"),
        ({"fjord": {"widths": [0.5, 0.25, 1.0]}}, "strictly ascending"),
        ({"fjord": {"widths": [0.5, 0.5, 1.0]}}, "strictly ascending"),
        ({"fjord": {"sample": "random"}}, "fjord.sample"),
        ({"system": None}, "fjord needs a system: block"),
        ({"policy": "bottom_up"}, "not policy: bottom_up"),
        ({"schedule": "vanilla"}, "not schedule: vanilla"),
        ({"system": {**SYSTEM, "cost": "measured"}}, "system.cost: flops"),
        ({"fjord": {"widths": [0.25, 0.5]}}, "must end with 1"),
        ({"system": {**SYSTEM, "abilities": "none"}}, "abilities: uniform or tiers"),
        ({"upload": "full"}, "use upload: partial"),
    ],
)
def test_bad_settings_are_one_clear_config_error(override, needle):
    with pytest.raises(ConfigError) as e:
        _cfg(**override)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and msg.count(needle) == 1


def test_no_system_block_through_a_yaml_override(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("dataset: digits\nmodel: mlp\nmethod: fjord\nclients_per_round: 2\n")
    with pytest.raises(ConfigError, match="fjord needs a system: block"):
        load_config(path)


def test_models_it_cannot_handle_are_refused():
    with pytest.raises(ConfigError, match="ordered dropout cannot narrow"):
        Experiment(_cfg(dataset="digits", model="resnet18", model_options={"stem": "cifar"}))


def test_engine_averages_each_entry_over_the_clients_holding_it():
    from fedbug.engine.simulation import Simulation

    cfg = _cfg(rounds=1, fjord={"widths": [0.25, 1.0]})
    res = run_experiment(cfg)
    exp = Experiment(cfg)
    w0 = exp.initial_weights()
    sim, rt = Simulation(exp), exp.make_runtime()
    num = torch.zeros_like(w0, dtype=torch.float64)
    den = torch.zeros_like(w0, dtype=torch.float64)
    for i in exp.selection.select(1, cfg.seed, exp.num_clients):
        task = ClientTask(1, i, cfg.seed, cfg.lr, exp.mean_samples, {}, 1, sim.client_extra(i))
        out = train_client(w0, task, exp.client_data(i), {}, rt)
        held = exp.algorithm.flat_mask(exp.space, task.extra["width"]).double()
        num += out.num_samples * out.delta.double() * held
        den += out.num_samples * held
    assert {sim.client_extra(i)["width"] for i in range(12)} == {0.25, 1.0}
    expect = torch.where(den > 0, w0.double() + num / den.clamp_min(1), w0.double())
    torch.testing.assert_close(res.weights.double(), expect, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["paper", "cpu"])
@pytest.mark.parametrize("dataset", ["femnist", "shakespeare"])
def test_table4_configs_mirror_table3(kind, dataset):
    from pathlib import Path

    from fedbug.config import read_config_doc, validate
    from fedbug.sweeps.sweep import expand

    root = Path(__file__).parent.parent.parent / "configs" / kind
    t3 = read_config_doc(root / f"freezefl-{dataset}-table3.yaml")
    t4 = read_config_doc(root / f"freezefl-{dataset}-table4.yaml")
    own = {"name", "grid", "fjord", "freezefl"}
    assert {k: v for k, v in t4.items() if k not in own} == {
        k: v for k, v in t3.items() if k not in own
    }
    assert t4["grid"] == {"method": ["fjord", "fjord_cs"]}
    cells = [cfg for _, cfg in expand(t4, t4["grid"])]
    assert [(c.algorithm, c.resolved_selection()) for c in cells] == [
        ("fjord", "uniform"),
        ("fjord", "reputation"),
    ]
    assert cells[1].reputation.warm_restart == 0
    assert validate(t4).fjord.widths == [0.25, 0.5, 0.75, 1.0]
