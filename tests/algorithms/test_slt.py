"""SLT (successive layer training): the stage table (the code's switching rounds), a
configuration's masks and frozen layers by hand, a step at a stage equals the hand-built narrow
network's with the frozen layers unmoved, the per-client bytes and memory through the engine,
evaluation at the stage's sub-model, ``configs: auto``, refusals."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny import tiny_config, without_timing
from torch import nn

from benchmarks.equivalence.slt_case import SLTResNet
from fedbug.algorithms.width.slt import (
    SLT,
    MemoryRule,
    SLTParams,
    auto_configs,
    code_ends,
    kept_channels,
    rounds_ends,
    rule_memory,
    stage_of,
)
from fedbug.cli import main
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine import Experiment, run_experiment
from fedbug.engine.client import ClientData, ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.errors import ConfigError
from fedbug.models import build_model
from fedbug.policies import build_policy

DEMO = Path(__file__).resolve().parents[2] / "configs" / "digits-demo.yaml"

# k1l1/SLT d9f491f, nets/SLTNets/configs/config__resnet20.json: the [s, f] of two constraints
CODE_0125 = [[0.03, 0.1], [0.03, 0.15], [0.03, 0.2], [0.03, 0.25], [0.06, 0.3], [0.07, 0.35]]
CODE_0125 += [[0.08, 0.4], [0.2, 0.45], [0.2, 0.5], [0.28, 0.55], [0.28, 0.6], [0.4, 0.65]]
CODE_0125 += [[0.4, 0.7], [0.7, 0.75], [0.8, 0.8], [1.0, 0.85]]
CODE_05 = [[0.47, 0.1], [0.5, 0.15], [0.55, 0.2], [0.64, 0.25], [0.68, 0.3], [0.83, 0.35]]
CODE_05 += [[0.95, 0.4], [1.0, 0.45]]


def slt(model, **params):
    alg = SLT(params=SLTParams(**params))
    wrapped = alg.wrap_model(model, "linear")
    return alg, wrapped


# -- the stage table ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("configs", "rounds", "ends"),
    [
        (CODE_0125, 1000, [30, 31, 35, 39, 43, 48, 53, 60, 85, 122, 165, 207, 278, 356, 545, 778]),
        (CODE_05, 1000, [470, 499, 533, 572, 623, 680, 766, 876]),
        (CODE_0125, 10, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 5, 7]),  # empty stages
    ],
)
def test_the_codes_switching_rounds_on_resnet20(configs, rounds, ends):
    """The code's ``_ranges`` (computed with its own code at d9f491f): pretraining int(s_1 N)
    rounds, then stages by the bytes each trains."""
    alg, _ = slt(SLTResNet(), configs=configs)
    assert alg.stage_ends(rounds) == [*ends, rounds]
    assert [c[1] for c in alg.configurations()] == list(range(len(configs) + 1))  # T = int(19 f)


def test_code_ends_by_hand():
    # two configurations training 300 and 100 bytes, s_1 = 0.25, 20 rounds: 5 pretraining, the
    # 15 left split 3 : 1 (cumulative 0.75 and 1: int(11.25) = 11 and 15)
    assert code_ends(0.25, [300, 100], 20) == [5, 16, 20]
    assert [stage_of(r, [5, 16, 20]) for r in (1, 5, 6, 16, 17, 20)] == [0, 0, 1, 1, 2, 2]
    assert rounds_ends([3, 3, 5], 8) == [2, 2, 4, 8]  # stage 1 empty
    assert [stage_of(r, [2, 2, 4, 8]) for r in range(1, 9)] == [0, 0, 2, 2, 3, 3, 3, 3]


def test_kept_channels_as_the_code_rounds():
    assert kept_channels(0.5, 16) == 8 and kept_channels(0.03, 16) == 1  # at least one
    assert kept_channels(0.19, 100) == 18  # 100 * (1 / (1 / 0.19)) = 18.99..., not 19


# -- a configuration's masks and frozen layers, by hand ----------------------------------------
def tiny_resnet():
    """stem 3 -> 4, block 4 -> 4 (identity), block 4 -> 8 (3x3 stride-2 conv shortcut), pool
    2, linear on 8 channels x 2 x 2: the steps conv1, layer1.0.conv1, layer1.0.conv2,
    layer2.0.conv1, layer2.0.conv2; the shortcut goes with layer2.0.conv2."""
    return SLTResNet(widths=(4, 8), blocks=(1, 1), classes=3, pool=2, image=8)


def rows_cols(masks, name):
    """(rows, input channels) a conv / linear weight mask keeps, or the rows of a vector."""
    m = masks[name]
    if m.dim() == 1:
        return int(m.sum())
    m = m.reshape(m.shape[0], m.shape[1], -1)[:, :, 0]
    return int(m.any(1).sum()), int(m.any(0).sum())


# (s, f) -> T = int(5 f); kept (rows, cols) per layer; frozen layers
RESNET_CASES = [
    # T = 0: everything at width s (the pretraining), nothing frozen
    (
        (0.5, 0.0),
        {
            "conv1": (2, 3),
            "layer1.0.conv2": (2, 2),
            "layer2.0.conv1": (4, 2),
            "layer2.0.shortcut.conv": (4, 2),
            "linear": (3, 16),
        },
        [],
    ),  # fmt: skip
    # T = 2: conv1, layer1.0.conv1 full; layer1.0.conv2 reads all 4, keeps 2; the stream after
    # it has 2 channels (the code's SLTShortcut); conv1 frozen
    (
        (0.5, 0.4),
        {
            "conv1": (4, 3),
            "layer1.0.conv1": (4, 4),
            "layer1.0.conv2": (2, 4),
            "layer2.0.conv1": (4, 2),
            "layer2.0.shortcut.conv": (4, 2),
            "linear": (3, 16),
        },
        ["bn1", "conv1"],
    ),  # fmt: skip
    # T = 4: layer2.0.conv1 trains at full width, layer2.0.conv2 and the shortcut keep
    # int(8 / 4) = 2 rows; the stem and block 1 frozen
    (
        (0.25, 0.8),
        {
            "layer2.0.conv1": (8, 4),
            "layer2.0.conv2": (2, 8),
            "layer2.0.shortcut.conv": (2, 4),
            "layer2.0.bn2.weight": 2,
            "linear": (3, 8),
        },
        ["bn1", "conv1", "layer1.0.bn1", "layer1.0.bn2", "layer1.0.conv1", "layer1.0.conv2"],
    ),  # fmt: skip
]


@pytest.mark.parametrize(("sf", "kept", "frozen"), RESNET_CASES)
def test_resnet_masks_and_frozen_layers_by_hand(sf, kept, frozen):
    alg, _ = slt(tiny_resnet(), configs=[sf])
    key = alg.configurations()[1]
    masks = alg.param_masks(key)
    for name, want in kept.items():
        full_name = name if name.endswith((".weight", ".bias")) else f"{name}.weight"
        assert rows_cols(masks, full_name) == want, name
    assert masks["linear.bias"].all()  # the classifier keeps every row
    assert sorted(alg.frozen(key)) == frozen


def test_the_last_stage_is_the_whole_model_its_prefix_frozen():
    alg, wrapped = slt(tiny_resnet(), configs=[[1.0, 1.0]])
    key = alg.configurations()[1]
    assert key == (1.0, 5) and alg.param_masks(key) is None
    space = ParamSpace(wrapped, find_units(wrapped, torch.zeros(2, 3, 8, 8)))
    # units: stem, layer1.0.conv1, .conv2, layer2.0.conv1, .conv2, shortcut, linear: the
    # steps 0..3 frozen, layer2.0.conv2 trains at full width with its shortcut
    assert alg.frozen_units(space, key) == (0, 1, 2, 3)


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.linear = nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.linear(F.relu(self.fc2(F.relu(self.fc1(x)))))


@pytest.mark.parametrize(
    ("sf", "fc1", "fc2", "linear", "frozen"),
    [
        ((0.5, 0.5), (6, 4), (3, 6), (3, 3), []),  # T = 1: fc1 full, fc2 int(3)
        ((0.34, 0.0), (2, 4), (2, 2), (3, 2), []),  # T = 0: int(6 * 0.34) = 2 everywhere
        ((0.34, 1.0), (6, 4), (6, 6), (3, 6), ["fc1"]),  # T = 2: all full, fc1 frozen
    ],
)
def test_chain_masks_and_frozen_layers_by_hand(sf, fc1, fc2, linear, frozen):
    alg, _ = slt(Chain(), configs=[sf])
    key = alg.configurations()[1]
    masks = alg.param_masks(key) or {
        n: torch.ones(p.shape, dtype=torch.bool) for n, p in Chain().named_parameters()
    }
    got = [rows_cols(masks, f"{n}.weight") for n in ("fc1", "fc2", "linear")]
    assert got == [fc1, fc2, linear]
    assert rows_cols(masks, "fc2.bias") == fc2[0]
    assert sorted(alg.frozen(key)) == frozen


# -- a step at a stage is the narrow network's -------------------------------------------------
class NarrowTiny(nn.Module):
    """tiny_resnet() at (s, T) = (0.5, 2), built by hand: stem 3 -> 4, block 1 4 -> 4 -> 2 (its
    input cut to 2 channels for the addition, the code's SLTShortcut), block 2 2 -> 4 -> 4 with
    a 2 -> 4 shortcut, linear on 4 channels x 2 x 2 = the first 16 features."""

    NAMES = {"conv1": "conv1", "bn1": "bn1", "c11": "layer1.0.conv1", "b11": "layer1.0.bn1",
             "c12": "layer1.0.conv2", "b12": "layer1.0.bn2", "c21": "layer2.0.conv1",
             "b21": "layer2.0.bn1", "c22": "layer2.0.conv2", "b22": "layer2.0.bn2",
             "sc": "layer2.0.shortcut.conv", "scb": "layer2.0.shortcut.bn",
             "linear": "linear"}  # fmt: skip

    def __init__(self):
        super().__init__()

        def bn(c):
            return nn.BatchNorm2d(c, track_running_stats=False, momentum=None)

        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, 1, 1, bias=False), bn(4)
        self.c11, self.b11 = nn.Conv2d(4, 4, 3, 1, 1, bias=False), bn(4)
        self.c12, self.b12 = nn.Conv2d(4, 2, 3, 1, 1, bias=False), bn(2)
        self.c21, self.b21 = nn.Conv2d(2, 4, 3, 2, 1, bias=False), bn(4)
        self.c22, self.b22 = nn.Conv2d(4, 4, 3, 1, 1, bias=False), bn(4)
        self.sc, self.scb = nn.Conv2d(2, 4, 3, 2, 1, bias=False), bn(4)
        self.linear = nn.Linear(16, 3)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        out = self.b12(self.c12(F.relu(self.b11(self.c11(x)))))
        x = F.relu(out + x[:, :2])
        out = self.b22(self.c22(F.relu(self.b21(self.c21(x)))))
        x = F.relu(out + self.scb(self.sc(x)))
        return self.linear(F.avg_pool2d(x, 2).flatten(1))

    def load_from(self, full):
        with torch.no_grad():
            for name, p in self.named_parameters():
                w = full.get_parameter(f"{self.NAMES[name.split('.')[0]]}.{name.split('.')[1]}")
                p.copy_(w[tuple(slice(0, n) for n in p.shape)])


SGD = TrainSettings(local_steps=2, batch_size=4, momentum=0.9, weight_decay=0.01, count_flops=False)


def test_two_steps_at_a_stage_equal_the_narrow_networks_the_frozen_layers_unmoved():
    torch.manual_seed(3)
    full, narrow = tiny_resnet(), NarrowTiny()
    narrow.load_from(full)
    x, y = torch.randn(4, 3, 8, 8), torch.tensor([0, 1, 2, 0])
    alg, wrapped = slt(full, configs=[[0.5, 0.4]], schedule="rounds", switch_rounds=[1])
    space = ParamSpace(wrapped, find_units(wrapped, x[:2]))
    rt = ClientRuntime(wrapped, space, build_policy("none"), alg, SGD, lambda v: v)
    w0 = space.flatten(wrapped)
    res = train_client(w0, ClientTask(1, 0, 0, 0.1, 4.0, rounds=2), ClientData(x, y), {}, rt)
    # the code's device: SGD over the parameters that require gradients (not the frozen stem)
    for p in (narrow.conv1.weight, narrow.bn1.weight, narrow.bn1.bias):
        p.requires_grad_(False)
    opt = torch.optim.SGD([p for p in narrow.parameters() if p.requires_grad], lr=0.1,
                          momentum=0.9, weight_decay=0.01)  # fmt: skip
    for _ in range(2):  # the same 4 images each step (one batch an epoch, reshuffled)
        opt.zero_grad()
        F.cross_entropy(narrow(x), y).backward()
        opt.step()
    before, after = space.state_dict(w0), space.state_dict(w0 + res.delta)
    for name, p in narrow.named_parameters():
        key = f"model.{NarrowTiny.NAMES[name.split('.')[0]]}.{name.split('.')[1]}"
        idx = tuple(slice(0, n) for n in p.shape)
        torch.testing.assert_close(after[key][idx], p.detach(), atol=2e-6, rtol=0)
    for key in ("model.conv1.weight", "model.bn1.weight", "model.bn1.bias"):  # frozen
        assert torch.equal(after[key], before[key])
    # outside the sub-model nothing moved, weight decay and momentum notwithstanding
    kept_rows = "model.layer1.0.conv2.weight"
    assert torch.equal(after[kept_rows][2:], before[kept_rows][2:])
    assert torch.equal(after["model.linear.weight"][:, 16:], before["model.linear.weight"][:, 16:])
    assert res.trained == [False, True, True, True, True, True, True]
    assert res.figures == {"stage": 1.0, "width": 0.5}
    assert torch.equal(res.entries, alg.flat_mask(space, (0.5, 2)))  # the frozen stem is held


# -- through the engine ------------------------------------------------------------------------
# the tiny config's MLP (64 -> 64 -> 32 -> 10): steps hidden.0 and hidden.1. Stage 0 (0.5, 0):
# 2778 entries; stage 1 (0.5, T=1): hidden.0 full, hidden.1 16 rows: 64*64+64 + 16*64+16 +
# 10*16+10 = 5370, all trained; stage 2 (1, T=2): the whole model (6570), hidden.0 frozen:
# 2080 + 330 = 2410 trained. code: pretraining int(0.5 * 4) = 2 rounds, then 5370 : 2410 of
# the 2 left: ends [2, int(2 * 5370 / 7780) + 2 = 3, 4].
STAGES = {1: (0, 2778, 2778), 2: (0, 2778, 2778), 3: (1, 5370, 5370), 4: (2, 6570, 2410)}


def _cfg(**kw):
    doc = dict(
        algorithm="slt",
        slt={"configs": [[0.5, 0.5], [1.0, 1.0]]},
        rounds=4,
        system={"abilities": "uniform"},  # per-client rows
        count_flops=True,
        threads=1,
    )
    doc.update(kw)
    return tiny_config(**{k: v for k, v in doc.items() if v is not None or k != "slt"})


def test_stages_bytes_and_memory_per_client_through_the_engine():
    res = run_experiment(_cfg())
    base = run_experiment(_cfg(algorithm="fedavg", slt=None))
    full_peak = base.records[0]["peak_mem_bytes"]
    for rec in res.records:
        stage, down, up = STAGES[rec["round"]]
        for c in rec["per_client"]:
            assert c["stage"] == stage and c["width"] == [0.5, 0.5, 1.0][stage]
            assert (c["bytes_down"], c["bytes_up"]) == (4 * down, 4 * up)
    # stage 2 trains the whole model but hidden.0: no gradient, momentum or saved input there
    assert res.records[-1]["peak_mem_bytes"] < full_peak


def test_evaluation_is_at_the_stages_sub_model():
    """Under eval: stage the evaluated model is the global one with the entries outside the
    round's sub-model zeroed (the narrow network); the last stage's is the whole model, its
    frozen prefix (held, not sent) included. eval: full evaluates the global model."""
    two = {"configs": [[0.5, 0.5], [1.0, 1.0]], "schedule": "rounds", "switch_rounds": [2, 5]}
    stage = run_experiment(_cfg(rounds=2, slt=two))  # round 2: stage 1, (0.5, T = 1)
    full = run_experiment(_cfg(rounds=2, slt={**two, "eval": "full"}))
    assert torch.equal(stage.weights, full.weights)
    exp = Experiment(_cfg(rounds=2, slt=two))
    held = exp.algorithm.flat_mask(exp.space, (0.5, 1))
    shown = exp.evaluator.figures(torch.where(held, stage.weights, torch.zeros(())))
    assert stage.records[-1]["test_loss"] == pytest.approx(shown["loss"], abs=1e-9)
    whole = exp.evaluator.figures(full.weights)["loss"]
    assert full.records[-1]["test_loss"] == pytest.approx(whole, abs=1e-9) != shown["loss"]
    last = run_experiment(_cfg())  # round 4: stage 2, the whole model, hidden.0 frozen
    whole = exp.evaluator.figures(last.weights)["loss"]
    assert last.records[-1]["test_loss"] == pytest.approx(whole, abs=1e-9)


@pytest.mark.slow
def test_processes_executor_gives_the_in_process_numbers():
    here = run_experiment(_cfg())
    there = run_experiment(_cfg(executor="processes", workers=2))
    assert without_timing(here.records) == without_timing(there.records)
    assert torch.equal(here.weights, there.weights)


def test_auto_configs_are_the_largest_widths_that_fit():
    """configs: auto on the MLP at constraint 0.75: one step (T = 1), its width the largest
    on the 0.001 grid whose step fits in the width-0.75 model's memory; 0.5 has none."""
    rule = MemoryRule(torch.randn(2, 64), torch.tensor([0, 1]), 16, 0)
    alg = SLT(params=SLTParams(constraint=0.75))
    alg.wrap_model(build_model("mlp", (64,), 10, 0), "classifier")
    configs = auto_configs(alg, rule)
    limit = rule_memory(alg, (0.75, 0), rule)
    assert [t for _, t in configs] == [1]
    s = configs[0][0]
    assert rule_memory(alg, (s, 1), rule) <= limit
    wider = min(j for j in range(round(s * 1000) + 1, 1001) if kept_channels(j / 1000, 32)
                > kept_channels(s, 32))  # fmt: skip
    assert rule_memory(alg, (wider / 1000, 1), rule) > limit
    alg = SLT(params=SLTParams(constraint=0.5))
    alg.wrap_model(build_model("mlp", (64,), 10, 0), "classifier")
    with pytest.raises(ConfigError, match=r"slt.constraint: 0.5: no configuration fits"):
        auto_configs(alg, rule)


def test_auto_configs_through_the_engine_from_the_traced_example():
    """Without a system: block the example is the batch the engine traces the units on; the
    clients train auto_configs' stages at the run's batch size and optimiser."""
    cfg = _cfg(slt={"constraint": 0.75}, rounds=3, system=None, count_flops=False)
    res, exp = run_experiment(cfg), Experiment(cfg)
    rt = exp.make_runtime()
    assert rt.model.example.shape == (2, 1, 8, 8)  # two digits
    rule = exp.algorithm.memory_rule(rt)
    assert (rule.batch_size, rule.state_copies) == (16, 0)  # the tiny config's batch, plain SGD
    configs = auto_configs(exp.algorithm, rule)
    assert exp.algorithm.configurations(rule) == [(configs[0][0], 0), *configs]
    assert [t for _, t in configs] == [1]  # one configuration, T = 1, nothing frozen
    # each round 3 clients send the entries their stage trains
    ends = exp.algorithm.stage_ends(3)
    keys = exp.algorithm.configurations()
    for rec in res.records:
        key = keys[stage_of(rec["round"], ends)]
        assert rec["bytes_up"] == 3 * exp.algorithm.trained_bytes(key)


def test_auto_configs_with_the_units_listed_run_as_with_them_traced():
    """Listed units (``units:`` or ``fedbug_units()``) leave the model untraced, so its clients
    have no example of their own: the configurations setup_run computed as the run was built
    serve them, and the run is the one with the same units traced."""
    kw = dict(slt={"constraint": 0.75}, rounds=2, system=None, count_flops=False)
    traced = without_timing(run_experiment(_cfg(**kw)).records)
    listed = _cfg(**kw, units=[["hidden.0"], ["hidden.1"], ["classifier"]])
    assert without_timing(run_experiment(listed).records) == traced


# -- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"slt": {"configs": [[1.5, 0.2]]}}, "a width s must be in (0, 1]"),
        ({"slt": {"configs": [[0.0, 0.2]]}}, "a width s must be in (0, 1]"),
        ({"slt": {"configs": [[0.5, 1.2]]}}, "f must be in [0, 1]"),
        ({"slt": {"constraint": 0.0}}, "constraint"),
        ({"slt": {"schedule": "rounds"}}, "needs slt.switch_rounds"),
        (
            {"slt": {"configs": [[0.5, 0.5]], "schedule": "rounds", "switch_rounds": [2, 3]}},
            "gives 2 rounds for 1 configs",
        ),  # fmt: skip
        ({"upload": "full"}, "use upload: partial"),
    ],
)
def test_bad_options_are_one_line(override, needle):
    with pytest.raises(ConfigError, match=None) as e:
        _cfg(**override)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg.strip(), msg


def test_a_constraint_no_configuration_fits_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"^slt.constraint: 0.5: no configuration fits.*slt"):
        run_experiment(_cfg(slt={"constraint": 0.5}, rounds=1))


def _fit_at(model, constraint, rule):
    """auto_configs' configurations for ``model`` (a build_model name) under ``rule``, or its
    refusal."""
    alg = SLT(params=SLTParams(constraint=constraint))
    shape, classifier = {"mlp": ((64,), "classifier"), "digits_cnn": ((1, 8, 8), "fc3")}[model]
    alg.wrap_model(build_model(model, shape, 10, 0), classifier)
    try:
        return auto_configs(alg, rule)
    except ConfigError as e:
        return str(e)


def test_the_refusal_names_the_smallest_constraint_that_fits_by_hand():
    """The MLP (64 -> 64 -> 32 -> 10; one configuration, T = 1) at batch 16, in 8-byte words:
    a width-c model keeping k0 = int(64 c), k1 = int(32 c) rows costs its float32 weights
    and their gradients (plain SGD), 65 k0 + k0 k1 + 11 k1 + 10 words, and the activations
    saved on the two examples, 8 times over: the linear layers' inputs, the ReLUs' outputs, the
    log-softmax (4 bytes x 2 x (64 + k0 + k1 + 10)) and the loss's 20 bytes: 8 (74 + k0 + k1)
    + 20 words. The narrowest step, hidden.0 full and hidden.1 one row (k0 = 64, k1 = 1):
    4245 + 1132 = 5377. 0.719 keeps 46 and 23 rows: 4853 + 622 = 5475 >= 5377; 0.718 keeps 45
    and 22: 4693 + 622 = 5315 < 5377 (the slow test below runs auto_configs at such edges). A
    smaller batch never fits: the step's weights and its activations a sample both outgrow
    the width-0.5 model's."""
    rule = MemoryRule(torch.randn(2, 64), torch.tensor([0, 1]), 16, 0)
    msg = _fit_at("mlp", 0.5, rule)
    assert "raise slt.constraint to at least 0.719 (for this model at batch_size 16), or " in msg
    assert "batch_size to" not in msg and msg.endswith("give slt.configs as [[s, f], ...]")
    alg = SLT(params=SLTParams(constraint=0.5))
    alg.wrap_model(build_model("mlp", (64,), 10, 0), "classifier")
    words = [rule_memory(alg, key, rule) / 8 for key in [(0.001, 1), (0.719, 0), (0.718, 0)]]
    assert words == [5377, 5475, 5315]


@pytest.mark.slow
def test_digits_cnns_smallest_constraint_and_largest_batch_are_the_edges_of_what_fits():
    """digits_cnn (the CLI test's message): at batch 50, 0.594 fits and 0.593 does not; at
    0.5, batch 21 fits and 22 does not (each auto_configs run a few seconds)."""
    x, y = torch.randn(2, 1, 8, 8), torch.tensor([0, 1])
    at50, at21, at22 = (MemoryRule(x, y, b, 0) for b in (50, 21, 22))
    assert isinstance(_fit_at("digits_cnn", 0.594, at50), list)
    assert "at least 0.594" in _fit_at("digits_cnn", 0.593, at50)
    assert isinstance(_fit_at("digits_cnn", 0.5, at21), list)
    assert "lower batch_size to 21 or less" in _fit_at("digits_cnn", 0.5, at22)


@pytest.mark.parametrize(
    "slt_block",
    [
        {"constraint": 0.5},  # no configuration fits
        {"constraint": 0.75, "schedule": "rounds", "switch_rounds": [2, 3]},  # auto gives one
    ],
)
def test_a_refusal_of_the_computed_configs_leaves_no_run_folder(tmp_path, slt_block):
    """Refused when the run is built, before its folder is written: the same call refused
    again (not told the folder holds a run)."""
    cfg = _cfg(slt=slt_block, rounds=2, system=None, count_flops=False)
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"^slt\."):
            run_experiment(cfg, tmp_path / "out" / "run")
        assert not (tmp_path / "out").exists()


def test_the_cli_refuses_the_demos_constraint_naming_what_fits_writing_nothing(tmp_path, capsys):
    """digits_cnn at batch 50: 0.5 is refused before anything is written, naming 0.594 (every
    j / 1000 scanned: the smallest whose width-j model holds the costliest narrowest step) and
    batch 21 (the edges checked by the slow test above)."""
    flags = [f for s in ["algorithm=slt", "rounds=1", "slt.constraint=0.5"] for f in ("-s", s)]
    for _ in range(2):  # again: the same refusal, not "already holds a run"
        rc = main(["run", str(DEMO), *flags, "--out", str(tmp_path / "out"), "--quiet"])
        lines = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(lines) == 1, lines
        assert lines[0].endswith(
            "raise slt.constraint to at least 0.594 (for this model at batch_size 50), or lower "
            "batch_size to 21 or less, or give slt.configs as [[s, f], ...]"
        )
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("sets", "words"),
    [
        (["slt.constraint=0"], ["slt.constraint"]),
        (["slt.configs=[[2, 0.5]]"], ["slt.configs", "(0, 1]"]),
        (["slt.configs=[1]"], ["slt.configs: auto or a list of [s, f] pairs", "got [1]"]),
        (["slt.constraint=0.5"], ["slt.constraint: 0.5", "no configuration fits"]),
    ],
)
def test_the_cli_gives_a_bad_option_one_line_and_exit_2(tmp_path, capsys, sets, words):
    flags = [f for s in ["algorithm=slt", "rounds=1", *sets] for f in ("-s", s)]
    rc = main(["run", str(DEMO), *flags, "--out", str(tmp_path), "--quiet"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("fedbug: error: "), lines
    assert all(w in lines[0] for w in words), lines[0]
