"""Gradient (activation) checkpointing of a Hugging Face model (``model_options:
{gradient_checkpointing: true}``, fedbug.models.hf): the bytes the forward pass keeps for
backward, counted by hand, fall to the blocks' inputs; training is bit for bit the same."""

from __future__ import annotations

import pytest
import torch
from tiny import user_data_config

import fedbug
from fedbug.core.blocks import block_units
from fedbug.core.flops import training_cost
from fedbug.core.tasks import NextToken
from fedbug.core.units import find_units
from fedbug.data import FederatedDataset
from fedbug.errors import ConfigError
from fedbug.models import build_model

transformers = pytest.importorskip("transformers")

V, T, d, L = 12, 8, 8, 2  # vocabulary, tokens, width, blocks
GPT2 = {"model_type": "gpt2", "n_layer": L, "n_embd": d, "n_head": 2, "n_positions": T}
NO_DROPOUT = {**GPT2, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}


def build(hf_config: dict, checkpointing: bool) -> torch.nn.Module:
    return build_model(
        "hf", (T,), V, 0, hf_config=hf_config, task="next_token",
        gradient_checkpointing=checkpointing,
    )  # fmt: skip


def test_the_forward_keeps_only_the_blocks_inputs_counted_by_hand():
    """N = 4 sequences, every weight trained. Checkpointed, the forward keeps for backward: the
    token ids and position ids (int64: N T and T), each block's input and the last block's
    output (the final norm's input), L + 1 tensors of N T d floats, the norm's mean and
    1/std (N T each) and its output (the head reads its last position, a view of it: the
    storage counts), the log-softmax's output (N V), the targets (int64, N) and the loss.
    Without checkpointing it keeps every block's attention and MLP tensors besides."""
    N, f, i64 = 4, 4, 8
    x = torch.randint(0, V, (N, T), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, V, (N,), generator=torch.Generator().manual_seed(1))
    by_hand = (
        i64 * N * T + i64 * T  # ids, positions
        + f * (L + 1) * N * T * d  # blocks' inputs, the last block's output
        + f * 2 * N * T  # the final norm's mean and 1/std
        + f * N * T * d  # its output, the head's input
        + f * N * V + i64 * N + f  # log-softmax, targets, loss
    )  # fmt: skip
    costs = {}
    for on in (False, True):
        m = build(NO_DROPOUT, on)
        every = [n for n, _ in m.named_parameters()]
        costs[on] = training_cost(m, every, x, y, NextToken().loss)
    assert costs[True].activations == by_hand == 4900
    assert costs[False].activations > 12 * costs[True].activations  # 61,732 bytes
    assert costs[True].trained == costs[False].trained
    # the blocks' forward runs again in backward (at most once more; torch stops a
    # recomputation once what backward needs is rebuilt)
    block = N * (24 * d * d * T + 4 * T * T * d)
    assert costs[False].flops < costs[True].flops <= costs[False].flops + L * block


def test_frozen_bottom_blocks_need_no_backward_when_checkpointed():
    """The embedding and block 0 frozen: nothing there requires a gradient, so checkpointing
    (non-reentrant) neither saves nor recomputes anything for them, and the trained block
    still gets its gradients."""
    N = 4
    x = torch.randint(0, V, (N, T))
    y = torch.randint(0, V, (N,))
    counts = {}
    for on in (False, True):
        m = build(NO_DROPOUT, on)
        units = find_units(m, names=block_units(m, x))
        top = [p for u in units[2:] for p in u.params]
        counts[on] = training_cost(m, top, x, y, NextToken().loss)
    assert counts[True].activations < counts[False].activations
    block = N * (24 * d * d * T + 4 * T * T * d)
    assert counts[False].flops < counts[True].flops <= counts[False].flops + block


def tokens(n: int = 48) -> FederatedDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (n, T), generator=g)
    y = torch.randint(0, V, (n,), generator=g)
    return FederatedDataset("tok", x, y, x[:16], y[:16], V, inputs="tokens")


@pytest.mark.parametrize(
    "extra",
    [
        {"policy": "bottom_up", "bottom_up": {"gu_ratio": 0.5}},
        {"adapters": {"kind": "lora", "r": 2}},
    ],
    ids=["fedbug", "lora"],
)
def test_training_is_bit_for_bit_the_same(extra):
    """Two rounds with GPT-2's dropout (p = 0.1; torch replays the draws in the recomputation),
    FedBug's frozen bottom blocks, or LoRA's constant base: the same weights, losses and
    accuracies; the counted step memory falls."""
    runs = []
    for on in (False, True):
        cfg = user_data_config(
            model="hf", hf_config=GPT2, task="next_token", units="blocks", count_flops=True,
            model_options={"gradient_checkpointing": on}, **extra,
        )  # fmt: skip
        runs.append(fedbug.run(cfg, dataset=tokens()))
    plain, ckpt = runs
    assert torch.equal(plain.weights, ckpt.weights)
    for a, b in zip(plain.records, ckpt.records):
        assert (a["train_loss"], a.get("acc")) == (b["train_loss"], b.get("acc"))
        assert b["flops"] > a["flops"]
    assert ckpt.summary["peak_mem_bytes"] < plain.summary["peak_mem_bytes"]


def test_a_value_that_is_not_true_or_false_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="gradient_checkpointing: true or false"):
        build_model(
            "hf", (T,), V, 0, hf_config=GPT2, task="next_token", gradient_checkpointing="yes"
        )
