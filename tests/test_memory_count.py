"""One training step's memory, counted (not measured) beside its FLOPs: the bytes autograd saves
for backward in the forward pass (each storage once, the model's own tensors apart), the
trainable parameters' gradients and the optimiser's state for them; the client's costliest step
in each result, the round's costliest client in the record, the run's in the summary.

The hand-worked network is Linear(4, 3) - ReLU - Linear(3, 2) on a batch of 5 (float32, 4 bytes),
cross-entropy loss (log_softmax then nll_loss). What autograd saves, with every weight trained:

* layer 1, ``addmm(b1, x, W1^T)``: x (5x4, 80 B) for W1's gradient; W1 for x's gradient is not
  saved (x needs none);
* the ReLU: its output h (5x3, 60 B);
* layer 2, ``addmm(b2, h, W2^T)``: h again (the same storage: counted once) for W2's gradient,
  and W2 (24 B) for h's gradient: a weight, held by the model anyway, so not an activation;
* log_softmax: its output (5x2, 40 B), which nll_loss saves too (once), with the labels (5
  int64, 40 B) and its total weight (a float32 scalar, 4 B).

Activations 80 + 60 + 40 + 40 + 4 = 224 B. With layer 1 frozen nothing upstream of layer 2
requires a gradient: x is not saved, nor W2 (h needs no gradient): 60 + 40 + 40 + 4 = 144 B.
The 23 parameters are 92 B: their gradients, SGD's momentum (one copy), Adam's two moments.
"""

from __future__ import annotations

import pytest
import torch
from tiny import tiny_config
from torch import nn

from fedbug.core.flops import FlopCache, StepMemory, optimizer_state_copies, training_cost
from fedbug.core.units import find_units
from fedbug.engine import run_experiment


def _ce(out, y):
    return nn.functional.cross_entropy(out, y)


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))


X, Y = torch.randn(5, 4), torch.tensor([0, 1, 0, 1, 1])
EVERY = ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_saved_activations_by_hand():
    full = training_cost(_mlp(), EVERY, X, Y, _ce)
    assert (full.activations, full.saved_weights, full.trained) == (224, 24, 92)
    head = training_cost(_mlp(), ["2.weight", "2.bias"], X, Y, _ce)
    assert (head.activations, head.saved_weights, head.trained) == (144, 0, 32)
    # layer 1 alone: x for W1's gradient, h (ReLU's backward), W2 for h's gradient, the loss's
    first = training_cost(_mlp(), ["0.weight", "0.bias"], X, Y, _ce)
    assert (first.activations, first.saved_weights, first.trained) == (224, 24, 60)
    # the FLOPs of the same pass: layer 1 forward and weight grad, layer 2 also its input grad
    assert full.flops == 5 * (2 * (2 * 4 * 3) + 3 * (2 * 3 * 2))


def test_optimizer_state_and_the_sum():
    assert optimizer_state_copies("sgd", 0.0) == 0
    assert optimizer_state_copies("sgd", 0.9) == 1
    assert optimizer_state_copies("adam", 0.0) == 2
    with pytest.raises(ValueError, match="rmsprop"):
        optimizer_state_copies("rmsprop", 0.0)
    full = training_cost(_mlp(), EVERY, X, Y, _ce)
    assert full.memory(0) == StepMemory(activations=224, gradients=92, optimizer=0)
    assert full.memory(1).total == 224 + 92 + 92
    assert full.memory(2).total == 224 + 92 + 184
    head = training_cost(_mlp(), ["2.weight", "2.bias"], X, Y, _ce)
    assert head.memory(2) == StepMemory(activations=144, gradients=32, optimizer=64)


def test_a_view_of_a_larger_batch_counts_only_the_batch():
    big = torch.randn(100, 4)
    assert training_cost(_mlp(), EVERY, big[:5], Y, _ce).activations == 224


def test_the_cache_counts_flops_and_memory_in_one_pass():
    model = _mlp()
    passes = []
    model.register_forward_hook(lambda *_: passes.append(1))
    wide = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    cache = FlopCache(model, _ce, narrow=lambda p: wide)
    units = find_units(model, X)
    passes.clear()
    cost = cache.unit_cost(units, [1], X, Y)
    assert cache.units(units, [1], X, Y) == cost.flops
    assert cache(["2.weight", "2.bias"], X, Y) == cost.flops
    assert cost.activations == 144 and len(passes) == 1
    # the wide network, every weight trained: x 80, h 5x6 120, W2 48 (a weight), the loss's 84
    w = cache.width_cost(1.0, X, Y)
    assert (w.activations, w.saved_weights, w.trained) == (80 + 120 + 84, 48, 4 * 44)
    assert cache.width(1.0, X, Y) == w.flops


# -- through the engine: the tiny config's MLP on digits (64 - 64 - 32 - 10), batch 16 --------
# activations: x 16x64 (4096 B), the ReLUs' outputs 16x64 (4096) and 16x32 (2048), the loss's
# log-probabilities 16x10 (640), labels (128) and total weight (4); every one of the 6570
# parameters trains (26280 B of gradients); plain SGD keeps no state, Adam two copies
TINY_ACTIVATIONS = 4096 + 4096 + 2048 + 640 + 128 + 4
TINY_PARAMS_BYTES = 4 * ((64 * 64 + 64) + (64 * 32 + 32) + (32 * 10 + 10))


def test_records_and_summary_carry_the_peak():
    res = run_experiment(tiny_config(optimizer="adam", lr=0.01, local_steps=1))
    parts = {
        "activations": TINY_ACTIVATIONS,
        "gradients": TINY_PARAMS_BYTES,
        "optimizer": 2 * TINY_PARAMS_BYTES,
    }
    for rec in res.records:
        assert rec["peak_mem_bytes"] == sum(parts.values()) == 11012 + 3 * 26280
        assert rec["peak_mem_parts"] == parts
    assert res.summary["peak_mem_bytes"] == sum(parts.values())
    assert res.summary["peak_mem_parts"] == parts
    again = run_experiment(tiny_config(optimizer="adam", lr=0.01, local_steps=1, rounds=1))
    assert again.records[0]["peak_mem_parts"] == res.records[0]["peak_mem_parts"]
    assert again.records[0]["flops"] == res.records[0]["flops"]  # counted again, the same


def test_nothing_is_counted_without_count_flops():
    res = run_experiment(tiny_config(count_flops=False, rounds=1))
    assert "peak_mem_bytes" not in res.records[0] and "peak_mem_parts" not in res.records[0]
    assert "peak_mem_bytes" not in res.summary


def test_a_frozen_head_has_no_gradient_or_state():
    res = run_experiment(tiny_config(policy="fixed_head", rounds=1, momentum=0.9))
    # the classifier frozen, every other unit trains: x, both ReLU outputs, W3 (a weight, for
    # the second ReLU's gradient), the loss's; the classifier's 330 parameters are not counted
    trained = TINY_PARAMS_BYTES - 4 * 330
    assert res.records[0]["peak_mem_parts"] == {
        "activations": TINY_ACTIVATIONS,
        "gradients": trained,
        "optimizer": trained,
    }


def test_fjord_counts_each_clients_narrow_model():
    system = {"abilities": "uniform"}
    cfg = tiny_config(
        method="fjord",
        fjord={"sample": "fixed"},
        num_clients=12,
        clients_per_round=4,
        rounds=1,
        system=system,
    )
    res = run_experiment(cfg)
    per_client = res.records[0]["per_client"]
    for c in per_client:
        p = c["width"]
        h1, h2 = int(64 * p), int(32 * p)
        params = (64 * h1 + h1) + (h1 * h2 + h2) + (h2 * 10 + 10)
        activations = 4096 + 16 * h1 * 4 + 16 * h2 * 4 + 640 + 128 + 4
        assert c["peak_mem"] == activations + 4 * params, c
    assert res.records[0]["peak_mem_bytes"] == max(c["peak_mem"] for c in per_client)
    assert len({c["width"] for c in per_client}) > 1


def test_a_flower_reply_carries_the_parts():
    pytest.importorskip("flwr")
    from tiny import TwoLayer

    from fedbug.core.protocol import ClientResult
    from fedbug.core.units import ParamSpace
    from fedbug.integrations.flower.messages import decode_reply, encode_reply

    model = TwoLayer()
    space = ParamSpace(model, find_units(model, torch.zeros(1, 2)))
    res = ClientResult(3, 5, torch.zeros(space.total), [True, True], {})
    res.set_peak_mem(StepMemory(activations=224, gradients=92, optimizer=184))
    back = decode_reply(encode_reply(res, space, [True, True]), space, 3)
    assert (back.mem_activations, back.mem_gradients, back.mem_optimizer) == (224, 92, 184)
    assert back.peak_mem == 500


def test_fedbug_cost_shows_a_steps_memory():
    from fedbug.config import load_config
    from fedbug.report.cost import cost_report, format_cost_report

    doc = {
        "dataset": "digits",
        "model": "digits_cnn",
        "num_clients": 10,
        "clients_per_round": 2,
        "rounds": 6,
        "local_epochs": 1,
        "batch_size": 10,
        "momentum": 0.9,
    }
    report = cost_report(load_config(None, doc=doc))
    # digits_cnn on 10 8x8 images: x 2560 B; conv1's ReLU output 10x16x8x8 (40960), its pool's
    # int64 indices (20480) and output (10240); conv2's ReLU output (20480), pool indices
    # (10240) and output (5120); the FC layers' ReLU outputs (2560 each); the loss's 484
    activations = 2560 + 40960 + 20480 + 10240 + 20480 + 10240 + 5120 + 2560 + 2560 + 484
    params = 160 + 4640 + 8256 + 4160 + 650  # conv1, conv2, fc1, fc2, fc3
    rows = report["rows"]
    assert rows[0]["peak_mem"] == activations + 2 * 4 * params  # gradients + momentum
    assert rows[-1]["peak_mem"] == (2560 + 484) + 2 * 4 * 650  # only the classifier trains
    assert [r["peak_mem"] for r in rows] == sorted((r["peak_mem"] for r in rows), reverse=True)
    assert report["methods"]["fedavg"]["peak_mem"] == rows[0]["peak_mem"]
    text = format_cost_report(report)
    assert "step memory" in text and f"{rows[0]['peak_mem']:,}" in text
