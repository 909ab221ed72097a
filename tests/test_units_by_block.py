"""units: blocks (fedbug.core.blocks) on models without transformers, and what a transformer
needs of the engine that any model may have: tied weights, non-persistent buffers, dropout
draws addressed by (seed, round, client), a causal LM's scores against one target per
sequence. The Hugging Face architectures themselves: tests/models/test_hf.py."""

import pytest
import torch
import torch.nn.functional as F
from tiny import user_data_config, without_timing
from torch import nn

import fedbug
from fedbug.core.blocks import block_units, find_blocks
from fedbug.core.tasks import NextToken
from fedbug.core.units import ParamSpace, find_units
from fedbug.data import FederatedDataset
from fedbug.errors import ConfigError
from fedbug.models import build_model


def test_resnet_stages_are_its_blocks_between_stem_and_classifier():
    m = build_model("resnet18", (3, 8, 8), 10, seed=0)
    # the stages, not the two blocks inside layer1 (a Sequential of one class too)
    assert find_blocks(m) == ["layer1", "layer2", "layer3", "layer4"]
    names = block_units(m, torch.zeros(2, 3, 8, 8))
    assert names == [["conv1", "norm1"], "layer1", "layer2", "layer3", "layer4", ["fc"]]


class Tiny(nn.Module):
    """emb -> 3 identical blocks (one ModuleList) -> head, with a tied head and dropout."""

    def __init__(self, tie: bool = True, p: float = 0.0) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 4)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(3))
        self.drop = nn.Dropout(p)
        self.head = nn.Linear(4, 5, bias=False)
        if tie:
            self.head.weight = self.emb.weight
        self.register_buffer("inv_freq", torch.ones(2), persistent=False)

    def forward(self, x):
        h = self.emb(x).mean(1)
        for b in self.blocks:
            h = self.drop(b(h))
        return self.head(h)


def test_blocks_units_and_a_tied_head_weight_train_with_the_embedding():
    m = Tiny()
    names = block_units(m, torch.zeros(2, 3, dtype=torch.long))
    assert names == [["emb"], "blocks.0", "blocks.1", "blocks.2", ["head"]]
    units = find_units(m, names=names)
    # head.weight is emb.weight: it sits once, in the first unit; the head held nothing else
    assert [u.name for u in units] == ["emb", "blocks.0", "blocks.1", "blocks.2"]
    assert units[0].params == ("emb.weight",)
    space = ParamSpace(m, units)
    assert space.total == 5 * 4 + 3 * (4 * 4 + 4)
    # the non-persistent buffer (a rotary embedding's inv_freq) is no state: not in the vector
    assert "inv_freq" not in space.names
    flat = space.bind(m)
    flat[:20] = 7.0
    assert torch.equal(m.head.weight, torch.full((5, 4), 7.0))


def test_traced_units_of_a_tied_model_give_the_weight_to_the_embedding():
    units = find_units(Tiny(), torch.zeros(2, 3, dtype=torch.long))
    assert [u.name for u in units] == ["emb", "blocks.0.0", "blocks.1.0", "blocks.2.0"]


def test_a_model_without_repeated_blocks_is_refused_in_one_line():
    m = build_model("logreg", (4,), 3, seed=0)
    with pytest.raises(ConfigError, match="units: blocks needs a repeated block list"):
        block_units(m, torch.zeros(2, 4))


def test_next_token_scores_the_last_position_against_one_target_per_sequence():
    out = torch.tensor([[[0.0, 9.0], [1.0, 0.0]], [[9.0, 0.0], [0.0, 2.0]]])  # (N=2, T=2, V=2)
    y = torch.tensor([0, 1])
    task = NextToken()
    assert task.output_problem(out, y, 2) is None
    # by hand: -log softmax([1, 0])[0] and -log softmax([0, 2])[1]
    want = (F.softplus(torch.tensor(-1.0)) + F.softplus(torch.tensor(-2.0))) / 2
    assert torch.allclose(task.loss(out, y), want)
    assert task.finish(task.batch_sums(out, y), 2)["acc"] == 1.0


def _tokens(n: int = 48, vocab: int = 5, length: int = 3) -> FederatedDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab, (n, length), generator=g)
    y = torch.randint(0, vocab, (n,), generator=g)
    return FederatedDataset("tok", x, y, x[:8], y[:8], vocab, inputs="tokens")


def test_dropout_draws_repeat_from_the_seed_whatever_ran_before_and_with_counting():
    ds = _tokens()

    def go(count_flops: bool) -> list:
        cfg = user_data_config(task="next_token", units="blocks", count_flops=count_flops)
        res = fedbug.run(cfg, dataset=ds, model=lambda: Tiny(p=0.5))
        keep = ("test_loss", "train_loss", "client_drift")
        return [{k: r[k] for k in keep} for r in without_timing(res.records)], res.weights

    a, wa = go(False)
    torch.rand(3)  # the global generator moved between the runs
    b, wb = go(False)
    c, wc = go(True)  # counting FLOPs runs a forward pass in training mode: its own draws
    assert a == b == c
    assert torch.equal(wa, wb) and torch.equal(wa, wc)
