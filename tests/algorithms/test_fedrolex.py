"""FedRolex (rolling width windows): the windows by hand (wrap-around, both directions), a step at
a rolled window is the narrow network's, the per-entry mean over holders, the code's counts
weighting by hand, full-width evaluation, executors, resume, refusals."""

from pathlib import Path

import pytest
import torch
from executor_checks import assert_same_run, flower_run
from test_heterofl import SGD, narrow_step
from test_width_planner import TinyResNet, rows_cols, vec
from tiny import tiny_config, without_timing
from torch import nn

from fedbug.algorithms.width import planner as P
from fedbug.algorithms.width.fedrolex import FedRolex, FedRolexParams, delta_key, held_key
from fedbug.cli import main
from fedbug.core.units import ParamSpace, find_units, traced_module_order
from fedbug.engine import Experiment, run_experiment
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, train_client
from fedbug.errors import ConfigError
from fedbug.policies import build_policy

DEMO = Path(__file__).resolve().parents[2] / "configs" / "digits-demo.yaml"


def runtime(model, example, settings=SGD, **params):
    alg = FedRolex(params=FedRolexParams(**params))
    wrapped = alg.wrap_model(model, traced_module_order(model, example)[-1])
    space = ParamSpace(wrapped, find_units(wrapped, example))
    rt = ClientRuntime(wrapped, space, build_policy("none"), alg, settings, lambda x: x)
    return rt, space.flatten(wrapped)


def task(width, round=1, client=0, lr=0.1):
    return ClientTask(round, client, 0, lr, 1.0, extra={"width": width})


def sets_at(alg, rate, round):
    """Each narrowed layer's window, as a list in window order."""
    return {k: v.tolist() for k, v in alg.index_sets(alg.window_key(rate, round)).items()}


# -- the windows -------------------------------------------------------------------------------
# TinyResNet's groups: the stage-1 stream (conv1, layer1.conv2) and layer1.conv1 of 4 channels,
# the stage-2 stream (layer2.shortcut, layer2.conv2) and layer2.conv1 of 8; rate 0.5 keeps 2, 4
FORWARD = {  # round: (window of the 4-channel layers, of the 8-channel layers); start j mod K
    1: ([0, 1], [0, 1, 2, 3]),  # j = 0: HeteroFL's prefix
    2: ([1, 2], [1, 2, 3, 4]),
    4: ([3, 0], [3, 4, 5, 6]),  # round K = 4: the 4-channel window wraps around
    5: ([0, 1], [4, 5, 6, 7]),  # round K + 1: back at the start; the 8-channel layers go on
    8: ([3, 0], [7, 0, 1, 2]),  # round 8 = K of the wide layers: theirs wraps
    9: ([0, 1], [0, 1, 2, 3]),
}
BACKWARD = {  # the code's torch.roll(arange(K), j % K)[:n]: start -j mod K
    1: ([0, 1], [0, 1, 2, 3]),
    2: ([3, 0], [7, 0, 1, 2]),
    4: ([1, 2], [5, 6, 7, 0]),
    5: ([0, 1], [4, 5, 6, 7]),
    8: ([1, 2], [1, 2, 3, 4]),
    9: ([0, 1], [0, 1, 2, 3]),
}


@pytest.mark.parametrize(("direction", "table"), [("forward", FORWARD), ("backward", BACKWARD)])
def test_windows_by_hand(direction, table):
    rt, _ = runtime(TinyResNet(), torch.zeros(1, 3, 8, 8), direction=direction)
    alg = rt.algorithm
    for round, (four, eight) in table.items():
        assert sets_at(alg, 0.5, round) == {
            "conv1": four,
            "layer1.conv2": four,  # the residual stream keeps one window
            "layer1.conv1": four,
            "layer2.shortcut": eight,
            "layer2.conv2": eight,
            "layer2.conv1": eight,
        }, round
    # round 1 is HeteroFL's prefix; rate 1 is the whole model every round
    prefix = P.prefix_sets(alg.plan, 0.25)
    assert all(
        torch.equal(alg.index_sets(alg.window_key(0.25, 1))[k], v) for k, v in prefix.items()
    )
    assert alg.window_key(1.0, 7) == 1.0 and alg.param_masks(1.0) is None


def test_masks_of_a_wrapped_window():
    """Round 4 forward: the 4-channel layers keep {3, 0}, the 8-channel ones {3, 4, 5, 6}."""
    rt, _ = runtime(TinyResNet(), torch.zeros(1, 3, 8, 8))
    m = rt.algorithm.param_masks(rt.algorithm.window_key(0.5, 4))
    assert torch.equal(m["conv1.weight"], rows_cols((4, 3, 3, 3), [0, 3], [0, 1, 2]))
    assert torch.equal(m["layer1.n2.weight"], vec(4, [0, 3]))
    assert torch.equal(m["layer2.conv1.weight"], rows_cols((8, 4, 3, 3), [3, 4, 5, 6], [0, 3]))
    assert torch.equal(m["layer2.shortcut.weight"], rows_cols((8, 4, 1, 1), [3, 4, 5, 6], [0, 3]))
    assert torch.equal(m["n4.bias"], vec(8, [3, 4, 5, 6]))
    assert torch.equal(m["linear.weight"], rows_cols((3, 8), [0, 1, 2], [3, 4, 5, 6]))
    assert torch.equal(m["linear.bias"], vec(3, [0, 1, 2]))


# -- one local step at a rolled window is the narrow network's -----------------------------------
def copy_window(full, narrow, keep):
    """The narrow network holds the window's weights (``keep``: full size -> kept indices)."""
    with torch.no_grad():
        for name, p in narrow.named_parameters():
            w = full.get_parameter(name)
            idx = [keep.get(s, torch.arange(s)) for s in w.shape[:2]]
            p.copy_(w[idx[0][:, None], idx[1][None, :]] if w.dim() > 1 else w[idx[0]])


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_one_step_at_a_rolled_window_equals_the_narrow_resnet(direction):
    torch.manual_seed(1)
    full = TinyResNet()
    four, eight = (FORWARD if direction == "forward" else BACKWARD)[4]
    keep = {4: torch.tensor(four), 8: torch.tensor(eight)}  # the image's 3, the 3 classes stay
    narrow = TinyResNet(2, 4, rate=0.5)
    copy_window(full, narrow, keep)
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 0, 1])  # class 2: no sample
    rt, w0 = runtime(full, x[:1], direction=direction)
    res = train_client(w0, task(0.5, round=4), ClientData(x, y), {}, rt)
    narrow_step(narrow, x, y, torch.tensor([True, True, False]))
    after, before = rt.space.state_dict(w0 + res.delta), rt.space.state_dict(w0)
    for name, p in narrow.named_parameters():
        got = after[f"model.{name}"]
        idx = [keep.get(s, torch.arange(s)) for s in got.shape[:2]]
        got = got[idx[0][:, None], idx[1][None, :]] if got.dim() > 1 else got[idx[0]]
        if name.startswith("linear"):  # row 2 is not sent (label split): its update is 0
            torch.testing.assert_close(got[:2], p[:2], atol=1e-6, rtol=0)
            assert torch.equal(got[2], before[f"model.{name}"][2][idx[1]] if p.dim() > 1 else
                               before[f"model.{name}"][2])  # fmt: skip
            continue
        torch.testing.assert_close(got, p, atol=1e-6, rtol=0)
    # outside the window nothing moved (weight decay, momentum notwithstanding)
    outside = [c for c in range(8) if c not in eight]
    w = "model.layer2.conv1.weight"
    assert torch.equal(after[w][outside], before[w][outside])
    assert not torch.equal(after[w][eight], before[w][eight])
    assert rt.model.active is None and rt.model.scale == 1.0


# -- the server ----------------------------------------------------------------------------------
class InputNormMLP(nn.Module):
    """BatchNorm over the 2 inputs (the first parameter), Linear(2, 4), ReLU, Linear(4, 3)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm1d(2, track_running_stats=False)
        self.fc1 = nn.Linear(2, 4)
        self.fc2 = nn.Linear(4, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(self.norm(x))))


def hand_round(alg, space, w0, state, round, rates, values):
    """A round of hand-made updates: client i holds rate i's window and moves each held entry by
    values[i] (sending what FedRolexClient.finish would)."""
    agg = Aggregate(space, "uniform")
    sel, _ = alg.counted_entries(space)
    for client, (rate, v) in enumerate(zip(rates, values)):
        held = alg.flat_mask(space, alg.window_key(rate, round))
        delta = v * held.float()
        extras = {delta_key(client): delta[sel], held_key(client): held[sel].float()}
        agg.add(delta, [True] * space.num_units, 1, held, extras)
    return alg.server_update(w0, agg, state, round, len(rates))


def mlp_setup(**params):
    model = InputNormMLP()
    alg = FedRolex(params=FedRolexParams(rates=[1, 0.5, 0.25], **params))
    wrapped = alg.wrap_model(model, "fc2")
    space = ParamSpace(wrapped, find_units(wrapped, torch.zeros(2, 2)))
    w0 = torch.zeros(space.total)
    return alg, space, w0, lambda step, name: space.state_dict(step.weights)[f"model.{name}"]


def test_the_server_averages_each_entry_over_its_holders():
    """Round 2: rate 1 holds hidden units 0-3, 0.5 the window {1, 2}, 0.25 {1}; updates 1, 2, 4."""
    alg, space, w0, got = mlp_setup()
    step = hand_round(alg, space, w0, alg.init_server_state(w0, 3), 2, [1, 0.5, 0.25], [1, 2, 4])
    torch.testing.assert_close(got(step, "fc1.bias"), torch.tensor([1, 7 / 3, 3 / 2, 1]))
    torch.testing.assert_close(got(step, "fc2.weight")[0], torch.tensor([1, 7 / 3, 3 / 2, 1]))
    torch.testing.assert_close(got(step, "norm.weight"), torch.tensor([7 / 3, 7 / 3]))
    assert step.state == {}


def test_nobody_holding_an_entry_leaves_it_bitwise():
    alg, space, w0, got = mlp_setup()
    w0 = torch.randn(space.total)
    step = hand_round(alg, space, w0, {}, 3, [0.5, 0.25], [1.0, 2.0])  # windows {2, 3}, {2}
    before = space.state_dict(w0)["model.fc1.bias"]
    assert torch.equal(got(step, "fc1.bias")[[0, 1]], before[[0, 1]])
    torch.testing.assert_close(got(step, "fc1.bias")[2], before[2] + 1.5)


def test_code_counts_weights_by_hand_on_three_clients():
    """The code's tmp_counts: round 1 the m-th holder of an entry weighs 1 + (m - 1); the counts
    then stand at 1 + holders; the first parameter (norm.weight) takes no running count; conv /
    hidden weights (fc1.weight) keep the plain mean."""
    alg, space, w0, got = mlp_setup(bn_linear_weights="code_counts")
    state = alg.init_server_state(w0, 3)
    # round 1 (prefixes): hidden unit 0 held by all three, 1 by clients 0-1, 2-3 by client 0
    s1 = hand_round(alg, space, w0, state, 1, [1, 0.5, 0.25], [1, 2, 4])
    third, half = (1 * 1 + 2 * 2 + 3 * 4) / 6, (1 * 1 + 2 * 2) / 3
    torch.testing.assert_close(got(s1, "fc1.bias"), torch.tensor([third, half, 1, 1]))
    torch.testing.assert_close(got(s1, "fc2.weight")[2], torch.tensor([third, half, 1, 1]))
    torch.testing.assert_close(got(s1, "fc2.bias"), torch.full((3,), third))
    torch.testing.assert_close(got(s1, "norm.weight"), torch.full((2,), 7 / 3))  # 1, 1, 1
    torch.testing.assert_close(got(s1, "norm.bias"), torch.full((2,), third))
    torch.testing.assert_close(got(s1, "fc1.weight")[:, 0], torch.tensor([7 / 3, 3 / 2, 1, 1]))
    counts = space.state_dict(s1.state["fedrolex_counts"])["model.fc1.bias"]
    assert counts.tolist() == [4, 3, 2, 2]
    # round 2 (forward windows {1, 2} and {1}): unit 1 held by all, weights 3, 4, 5
    s2 = hand_round(alg, space, w0, s1.state, 2, [1, 0.5, 0.25], [1, 2, 4])
    want = [1, (3 * 1 + 4 * 2 + 5 * 4) / 12, (2 * 1 + 3 * 2) / 5, 1]
    torch.testing.assert_close(got(s2, "fc1.bias"), torch.tensor(want))
    counts = space.state_dict(s2.state["fedrolex_counts"])["model.fc1.bias"]
    assert counts.tolist() == [5, 6, 4, 3]


def test_a_client_sends_its_counted_entries_under_code_counts():
    torch.manual_seed(0)
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 0, 1])
    rt, w0 = runtime(TinyResNet(), x[:1], bn_linear_weights="code_counts")
    res = train_client(w0, task(0.5, round=3, client=7), ClientData(x, y), {}, rt)
    sel, ranked = rt.algorithm.counted_entries(rt.space)
    assert torch.equal(res.extras[delta_key(7)], res.delta[sel])
    assert torch.equal(res.extras[held_key(7)], res.entries[sel].float())
    names = {n for n, off, k in zip(rt.space.names, rt.space.offsets, rt.space.numels)
             if sel[off : off + k].any()}  # fmt: skip
    assert "model.linear.weight" in names and "model.layer1.n1.bias" in names
    assert not any(n.endswith("conv1.weight") or n.endswith("conv2.weight") for n in names)
    assert bool(ranked.all())  # TinyResNet's first parameter is the stem conv's


# -- through the engine ------------------------------------------------------------------------
SYSTEM = {"abilities": "uniform", "ability_min": 0.5, "ability_max": 3.0}


def _cfg(**kw):
    base = dict(
        method="fedrolex",
        num_clients=10,
        clients_per_round=4,
        rounds=2,
        local_steps=2,
        weighting="uniform",
        count_flops=False,
        threads=1,
    )
    base.update(kw)
    return tiny_config(**base)


def test_costs_are_the_narrow_networks():
    """FLOPs and peak step memory of a rate's narrow network, whatever the round's window (one
    full batch a round: a client's FLOPs are n x the per-sample cost)."""
    cfg = _cfg(system=SYSTEM, count_flops=True, local_steps=None, local_epochs=1, batch_size=1000)
    res = run_experiment(cfg)
    exp = Experiment(cfg)
    rt, alg = exp.make_runtime(), exp.algorithm
    names = [n for n, _ in rt.model.named_parameters()]
    costs = res.summary["clients"]["width_costs"]
    widths = set()
    for rec in res.records:
        for c in rec["per_client"]:
            width = c["width"]
            assert c["flops"] == pytest.approx(exp.sizes[c["id"]] * costs[str(width)])
            d = exp.client_data(c["id"])
            x = rt.prepare(d.x)
            narrow = alg.step_cost(rt.flop_model, width, names, x, d.y).memory(rt.state_copies)
            assert c["peak_mem"] == narrow.total > 0
            widths.add(width)
    assert len(widths) > 1 and widths != {1.0}


def test_evaluation_uses_the_full_model():
    cfg = _cfg(rounds=2)
    res = run_experiment(cfg)
    exp = Experiment(cfg)
    inner = exp.template.model
    state = {k.removeprefix("model."): v for k, v in exp.space.state_dict(res.weights).items()}
    inner.load_state_dict(state)
    with torch.no_grad():
        pred = inner(exp.dataset.prepare(exp.dataset.test_x)).argmax(1)
    acc = int((pred == exp.dataset.test_y).sum()) / len(exp.dataset.test_y)
    assert res.records[-1]["test_acc"] == pytest.approx(acc, abs=1e-9)


def test_direction_and_weights_change_the_run():
    a = run_experiment(_cfg(rounds=3)).weights
    b = run_experiment(_cfg(rounds=3, fedrolex={"direction": "backward"})).weights
    c = run_experiment(_cfg(rounds=3, fedrolex={"bn_linear_weights": "code_counts"})).weights
    assert not torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.slow
def test_processes_executor_gives_the_in_process_numbers():
    cfg = _cfg(fedrolex={"bn_linear_weights": "code_counts"}, rounds=3)
    here = run_experiment(cfg)
    there = run_experiment(cfg.model_copy(update={"executor": "processes", "workers": 2}))
    assert_same_run(there, here)


def test_flowers_message_path_gives_the_in_process_numbers():
    """The rate in each task's config, the entries and the code_counts extras in each reply."""
    cfg = _cfg(fedrolex={"bn_linear_weights": "code_counts"}, rounds=3)
    here = run_experiment(cfg)
    assert_same_run(flower_run(cfg), here)


def test_resume_equals_uninterrupted(tmp_path):
    """code_counts keeps its counts as server state: a resumed run gives the same numbers."""
    cfg = _cfg(fedrolex={"bn_linear_weights": "code_counts"}, rounds=4, checkpoint_every=1)
    full = run_experiment(cfg, tmp_path / "full")
    run_experiment(cfg, tmp_path / "cut", stop_after=2)
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)
    assert torch.equal(resumed.weights, full.weights)


def test_masks_of_past_rounds_are_dropped():
    rt, _ = runtime(TinyResNet(), torch.zeros(1, 3, 8, 8))
    alg = rt.algorithm
    for r in range(1, 20):
        alg.start_client(task(0.5, round=r), torch.tensor([0]), rt)
        alg.param_masks(alg.window_key(0.5, r))
    assert len(alg._masks) == 1  # noqa: SLF001 - the cache itself is what is checked


# -- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"fedrolex": {"rates": [1, 1.5]}}, "every fedrolex rate must be in (0, 1]"),
        ({"fedrolex": {"rates": [1, 0]}}, "every fedrolex rate must be in (0, 1]"),
        ({"fedrolex": {"rates": [0.5, 0.25]}}, "1 must be one of them"),
        ({"fedrolex": {"direction": "sideways"}}, "fedrolex.direction"),
        ({"fedrolex": {"bn_linear_weights": "counts"}}, "fedrolex.bn_linear_weights"),
        ({"fedrolex": {"overlap": 0.5}}, "leave fedrolex.overlap null"),
        (
            {"fedrolex": {"bn_linear_weights": "code_counts"}, "weighting": "samples"},
            "use weighting: uniform",
        ),
        ({"upload": "full"}, "use upload: partial"),
        ({"system": {**SYSTEM, "cost": "measured"}, "count_flops": True}, "system.cost: flops"),
        ({"fedrolex": {"assign": "by_ability"}}, "abilities: uniform or tiers"),
    ],
)
def test_bad_settings_are_one_clear_config_error(override, needle):
    with pytest.raises(ConfigError) as e:
        _cfg(**override)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and msg.count(needle) == 1, msg


def test_the_cli_runs_the_demo_and_gives_a_bad_option_one_line_and_exit_2(tmp_path, capsys):
    flags = ["algorithm=fedrolex", "policy=none", "clip_grad_norm=1", "rounds=1"]
    args = [f for s in flags for f in ("-s", s)]
    assert main(["run", str(DEMO), *args, "--out", str(tmp_path / "ok"), "--quiet"]) == 0
    capsys.readouterr()
    bad = [*args, "-s", "fedrolex.rates=[1,2]"]
    rc = main(["run", str(DEMO), *bad, "--out", str(tmp_path / "bad"), "--quiet"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("fedbug: error: "), lines
    assert "fedrolex.rates" in lines[0] and "(0, 1]" in lines[0], lines[0]
