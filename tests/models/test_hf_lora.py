"""LoRA adapters as the trainable part (fedbug.models.adapters, through peft): only adapter
weights train and travel, every freeze policy acts on each block's adapters, the base weights
are constants that never move, FLOPs by hand, a target that matches no layer names those that
exist. Configs: tests/models/test_hf.py's GPT-2-, BERT- and Llama-shaped ones."""

from __future__ import annotations

import pytest
import torch
from test_hf import ARCHS, GPT2, T, V, spy_clients, tokens
from tiny import method_needs, user_data_config, without_timing

import fedbug
from fedbug.core.blocks import block_units
from fedbug.core.flops import training_cost
from fedbug.core.tasks import NextToken
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine import run_experiment
from fedbug.errors import ConfigError
from fedbug.models import build_model
from fedbug.policies import POLICIES

pytest.importorskip("peft")

LORA = {"kind": "lora", "r": 2}
#: adapter weights per block by hand, r (in + out) per target at r = 2, d = 8: GPT-2's c_attn
#: (8 -> 24); BERT's query and value (8 -> 8 each); Llama's q_proj (8 -> 8) and v_proj (8 -> 4:
#: one key/value head of 4)
PER_BLOCK = {"gpt2": 2 * (8 + 24), "bert": 2 * 2 * (8 + 8), "llama": 2 * (8 + 8) + 2 * (8 + 4)}


def build(arch: str, seed: int = 0, adapters: dict | None = None) -> torch.nn.Module:
    hf_config, task, *_ = ARCHS[arch]
    return build_model("hf", (T,), V, seed, hf_config=hf_config, task=task, adapters=adapters)


def constants(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base weights an adapted model holds as non-persistent buffers."""
    params = {n for n, _ in model.named_parameters()}
    return {n: b.clone() for n, b in model.named_buffers() if n not in params}


@pytest.mark.parametrize("arch", ARCHS)
def test_adapters_are_the_only_weights_one_unit_per_block(arch):
    _, _, _, blocks, _ = ARCHS[arch]
    m = build(arch, adapters=LORA)
    layers = m.config.num_hidden_layers
    names = block_units(m, torch.zeros(2, T, dtype=torch.long))
    assert names == [f"{blocks}.{i}" for i in range(layers)]
    units = find_units(m, names=names)
    assert all(".lora_" in p for u in units for p in u.params)
    assert [sum(m.get_parameter(p).numel() for p in u.params) for u in units] == [
        PER_BLOCK[arch]
    ] * layers
    # the base: every weight of the plain model, now a constant with its values
    plain = build(arch)
    kept = constants(m)
    for n, w in plain.named_parameters():
        where = (
            n
            if n in kept
            else n.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        )
        assert torch.equal(kept[where], w), n


@pytest.fixture
def trained(monkeypatch):
    return spy_clients(monkeypatch)


@pytest.mark.parametrize("policy", POLICIES.names())
@pytest.mark.parametrize("arch", ARCHS)
def test_one_round_under_every_policy_trains_and_sends_adapters_only(arch, policy, trained):
    hf_config, task, *_ = ARCHS[arch]
    doc = dict(model="hf", hf_config=hf_config, task=task, adapters=LORA, policy=policy)
    cfg = user_data_config(**{**doc, "rounds": 1, **method_needs(policy)})
    if policy == "fixed_last_two" and arch != "bert":  # two adapter units, both would freeze
        with pytest.raises(ConfigError, match="freezes all 2 units"):
            fedbug.run(cfg, dataset=tokens())
        return
    res = fedbug.run(cfg, dataset=tokens())
    layers = len(trained[0][2])
    total = PER_BLOCK[arch] * layers
    assert res.weights.numel() == total  # the global model the server keeps: adapters
    rec = res.records[-1]
    assert rec["bytes_down"] == 2 * 4 * total  # two clients, float32
    assert 0 < rec["bytes_up"] <= 2 * 4 * total
    for _, result, slices, _ in trained:
        for u, s in enumerate(slices):  # frozen adapter units did not move, trained ones did
            assert bool(result.delta[s].abs().sum() > 0) == result.trained[u]
        assert result.bytes_up == 4 * sum(
            s.stop - s.start for s, up in zip(slices, result.uploaded) if up
        )
    if policy == "none":
        assert rec["bytes_up"] == 2 * 4 * total


def test_base_weights_stay_as_built_through_training(trained):
    cfg = user_data_config(model="hf", hf_config=GPT2, task="next_token", adapters=LORA)
    fedbug.run(cfg, dataset=tokens())
    fresh = constants(build("gpt2", adapters=LORA))
    runtime_model = trained[-1][3]
    after = constants(runtime_model)
    assert after.keys() == fresh.keys() and len(fresh) > 20
    assert all(torch.equal(after[n], fresh[n]) for n in fresh)


def test_flops_with_adapters_by_hand():
    """GPT-2 (d = 8, L = 2, T = 8, V = 12, N = 4) with r = 2 adapters on c_attn (8 -> 24):
    forward as the plain model (per block 24 d^2 T + 4 T^2 d, head 2 d V on the last position)
    plus A and B, 2 r (d + 3d) T = 8 d r T per block. Backward, only the adapters train: the
    head, whose matrix is frozen, its input gradient only; block 1 every input gradient
    (block 0 needs them; 24 d^2 T, attention twice its forward) and its adapters' both
    (2 x 8 d r T); block 0 down to its adapters: the MLP and the projection's input gradients
    (16 + 2) d^2 T, attention 8 T^2 d, B's weight and input gradients (2 x 6 d r T) and A's
    weight gradient (2 d r T), no more (nothing under it trains)."""
    d, N, r = 8, 4, 2
    block, head, lora = 24 * d * d * T + 4 * T * T * d, 2 * d * V, 8 * d * r * T
    forward = 2 * (block + lora) + head
    backward = head + (24 * d * d * T + 8 * T * T * d + 2 * lora)
    backward += 18 * d * d * T + 8 * T * T * d + 12 * d * r * T + 2 * d * r * T
    m = build("gpt2", adapters=LORA)
    x, y = torch.randint(0, V, (N, T)), torch.randint(0, V, (N,))
    names = [n for n, _ in m.named_parameters()]
    cost = training_cost(m, names, x, y, NextToken().loss)
    assert cost.flops == N * (forward + backward)
    assert cost.trained == 4 * 2 * PER_BLOCK["gpt2"]


def test_resume_from_a_checkpoint_of_adapters_equals_the_uninterrupted_run(tmp_path):
    cfg = user_data_config(
        model="hf", hf_config=GPT2, task="next_token", adapters=LORA, policy="bottom_up",
        rounds=3, checkpoint_every=1,
    )  # fmt: skip
    ds = tokens()
    full = run_experiment(cfg, tmp_path / "full", dataset=ds)
    run_experiment(cfg, tmp_path / "cut", dataset=ds, stop_after=2)
    resumed = run_experiment(cfg, tmp_path / "cut", dataset=ds, resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)
    assert torch.equal(resumed.weights, full.weights)


def test_full_layers_train_whole_beside_the_adapters():
    """BERT's new classifier (8 -> 12 classes, 108 weights) trains whole: a unit after the
    blocks."""
    m = build("bert", adapters={**LORA, "full_layers": ["classifier"]})
    units = find_units(m, names=block_units(m, torch.zeros(2, T, dtype=torch.long)))
    assert [u.params for u in units[-1:]] == [("classifier.weight", "classifier.bias")]
    assert sum(p.numel() for p in m.parameters()) == 3 * PER_BLOCK["bert"] + 8 * 12 + 12


@pytest.mark.parametrize(
    ("adapters", "words"),
    [
        ({"targets": ["c_atn"]}, "adapters.targets: c_atn match(es) no layer of GPT2LMHeadModel"),
        ({"full_layers": ["head"]}, "adapters.full_layers: head match(es) no layer"),
    ],
)
def test_a_name_that_matches_no_layer_lists_the_layers(adapters, words):
    with pytest.raises(ConfigError) as e:
        build("gpt2", adapters=adapters)
    assert words in str(e.value)
    assert "its layers: wte, wpe, ln_1, c_attn, c_proj, ln_2, c_fc, ln_f, lm_head" in str(e.value)


def test_adapters_need_a_hugging_face_model():
    from fedbug.config import load_config

    with pytest.raises(ConfigError, match="adapters: has no effect under model: mlp"):
        load_config(None, doc={"dataset": "digits", "model": "mlp", "adapters": LORA})


def _products(space, flat: torch.Tensor, consts: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """Each adapted layer's B A from a flat vector (A from ``consts`` where it is constant)."""
    named = {**consts, **space.state_dict(flat)}
    return [named[n] @ named[n.replace("lora_B", "lora_A")] for n in named if ".lora_B." in n]


@pytest.mark.parametrize("freeze_a", [True, False])
def test_ffa_lora_averages_the_products_exactly_plain_lora_does_not(freeze_a, trained):
    """Two clients of 12 samples each (equal weights): the server's B A against the mean of
    the clients' B_i A_i. With A frozen (FFA-LoRA) only B travels (GPT-2: 24 x 2 per block)
    and the two agree to float rounding; averaging A and B apart, they differ."""
    adapters = {**LORA, "freeze_a": freeze_a}
    cfg = user_data_config(
        model="hf", hf_config=GPT2, task="next_token", adapters=adapters, rounds=1, lr=0.5
    )
    res = fedbug.run(cfg, dataset=tokens())
    (w0, r1, _, m1), (_, r2, _, _) = trained
    space = ParamSpace(m1, find_units(m1, names=block_units(m1, tokens().train_x[:2])))
    consts = constants(m1)
    assert res.weights.numel() == (2 * 24 * 2 if freeze_a else 2 * PER_BLOCK["gpt2"])
    mean = [
        (a + b) / 2
        for a, b in zip(
            _products(space, w0 + r1.delta, consts), _products(space, w0 + r2.delta, consts)
        )
    ]
    server = _products(space, res.weights, consts)
    gap = max(float((s - m).abs().max()) for s, m in zip(server, mean))
    scale = max(float(m.abs().max()) for m in mean)
    assert scale > 1e-3
    assert (gap < 1e-6 * scale) if freeze_a else (gap > 1e-4 * scale)  # 7e-8, 3e-3 seen


def test_peak_memory_of_a_round_is_what_trains_by_hand():
    """GPT-2 (d = 8, V = 12, 8 positions): embedding 12*8 + 8*8 = 160 weights, a block 872
    (two norms 32, qkv 216, projection 72, MLP 288 + 264), the final norm 16: 1920 in all.
    Gradients and SGD momentum hold 4 bytes per trained weight: all 1920 (every unit), 1032
    (fixed_last_two: embedding and block 0 of the four block units), 128 (LoRA, r = 2)."""
    cases = [
        ({"units": "blocks"}, 1920),
        ({"units": "blocks", "policy": "fixed_last_two"}, 160 + 872),
        ({"adapters": LORA}, 2 * PER_BLOCK["gpt2"]),
    ]
    totals = []
    for extra, trained_weights in cases:
        cfg = user_data_config(
            model="hf", hf_config=GPT2, task="next_token", rounds=1, momentum=0.9,
            count_flops=True, **extra,
        )  # fmt: skip
        rec = fedbug.run(cfg, dataset=tokens()).records[-1]
        parts = rec["peak_mem_parts"]
        assert parts["gradients"] == parts["optimizer"] == 4 * trained_weights
        assert rec["peak_mem_bytes"] == sum(parts.values())
        totals.append(rec["peak_mem_bytes"])
    assert totals[0] > totals[1] > totals[2]


@pytest.mark.parametrize("algorithm", ["fedper", "fedrep", "lg_fedavg", "fedrod"])
def test_a_head_apart_under_adapters_needs_a_head_that_trains_whole(algorithm):
    """Under adapters the model's own head is a constant, so without full_layers the last unit
    (an algorithm's head) is the last block's adapters: an algorithm keeping a head apart
    (personal, or FedBABU's never-trained one) is refused with the fix; naming the classifier
    in full_layers makes it a real head."""
    from fedbug.config import load_config

    hf_config, task, *_ = ARCHS["bert"]
    doc = {
        "dataset": "digits",
        "model": "hf",
        "hf_config": hf_config,
        "task": task,
        "algorithm": algorithm,
        "evaluation": "personalized",
        "adapters": LORA,
    }
    with pytest.raises(ConfigError, match=f"{algorithm} keeps a personal head on each client"):
        load_config(None, doc=doc)
    load_config(None, doc={**doc, "adapters": {**LORA, "full_layers": ["classifier"]}})
    with pytest.raises(ConfigError, match="fedbabu keeps a head apart from the base"):
        load_config(None, doc={**doc, "algorithm": "fedbabu"})  # its head: the last adapters
