"""Hugging Face transformers through the whole engine (fedbug.models.hf, units: blocks): GPT-2-,
BERT- and Llama-shaped configs of a couple of thousand parameters, built from keys with random
weights (nothing is downloaded), cut into blocks, trained one round under every freeze policy,
counted, checkpointed; a model that cannot be loaded offline is one line, exit 2."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tiny import method_needs, user_data_config, without_timing

import fedbug
from fedbug.cli import main
from fedbug.config import load_config
from fedbug.core.blocks import block_units
from fedbug.core.flops import training_cost
from fedbug.core.tasks import NextToken
from fedbug.core.units import ParamSpace, find_units
from fedbug.data import FederatedDataset
from fedbug.engine import run_experiment
from fedbug.engine.executors import sequential
from fedbug.errors import ConfigError
from fedbug.models import build_model
from fedbug.policies import POLICIES

transformers = pytest.importorskip("transformers")

V, T = 12, 8  # vocabulary (the data set's classes for a causal LM) and sequence length
GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 8, "n_head": 2, "n_positions": T}
BERT = {
    "model_type": "bert",
    "num_hidden_layers": 3,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "intermediate_size": 16,
    "vocab_size": V,
    "max_position_embeddings": T,
}
LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 8,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 16,
    "max_position_embeddings": T,
}
#: hf_config, task, the embedding unit's modules, the block list, the head unit's modules
ARCHS: dict[str, tuple[dict[str, Any], str, list[str], str, list[str]]] = {
    "gpt2": (GPT2, "next_token", ["transformer.wte", "transformer.wpe"], "transformer.h",
             ["transformer.ln_f", "lm_head"]),
    "bert": (BERT, "classification", ["bert.embeddings.word_embeddings",
             "bert.embeddings.token_type_embeddings", "bert.embeddings.position_embeddings",
             "bert.embeddings.LayerNorm"], "bert.encoder.layer", ["bert.pooler.dense",
             "classifier"]),
    "llama": (LLAMA, "next_token", ["model.embed_tokens"], "model.layers",
              ["model.norm", "lm_head"]),
}  # fmt: skip


def tokens(n: int = 48) -> FederatedDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (n, T), generator=g)
    y = torch.randint(0, V, (n,), generator=g)
    return FederatedDataset("tok", x, y, x[:16], y[:16], V, inputs="tokens")


def build(arch: str, seed: int = 0) -> torch.nn.Module:
    hf_config, task, *_ = ARCHS[arch]
    return build_model("hf", (T,), V, seed, hf_config=hf_config, task=task)


@pytest.mark.parametrize("arch", ARCHS)
def test_blocks_are_the_configs_layers_between_embedding_and_head(arch):
    _, _, emb, blocks, head = ARCHS[arch]
    m = build(arch)
    layers = m.config.num_hidden_layers
    names = block_units(m, torch.zeros(2, T, dtype=torch.long))
    assert names == [emb, *(f"{blocks}.{i}" for i in range(layers)), head]
    units = find_units(m, names=names)
    space = ParamSpace(m, units)
    assert space.total == sum(p.numel() for p in m.parameters())  # each weight once
    for i in range(layers):
        assert all(p.startswith(f"{blocks}.{i}.") for p in units[1 + i].params)
    assert 1000 < space.total < 3000
    if arch == "gpt2":  # its head reuses the token embedding's matrix: trained with the embedding
        assert "transformer.wte.weight" in units[0].params
        assert [p for u in units for p in u.params if p.startswith("lm_head")] == []


def test_random_weights_come_from_the_run_seed():
    a, b, c = build("llama", 0), build("llama", 0), build("llama", 1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def spy_clients(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """Each client's (received weights, result, unit slices, trained model) as the sequential
    executor runs it."""
    calls: list[tuple[Any, ...]] = []
    inner = sequential.train_client

    def spy(weights, task, data, state, runtime):
        result = inner(weights, task, data, state, runtime)
        calls.append((weights.clone(), result, runtime.space.unit_slices, runtime.model))
        return result

    monkeypatch.setattr(sequential, "train_client", spy)
    return calls


@pytest.fixture
def trained(monkeypatch):
    return spy_clients(monkeypatch)


@pytest.mark.parametrize("policy", POLICIES.names())
@pytest.mark.parametrize("arch", ARCHS)
def test_one_round_by_blocks_under_every_policy_moves_only_trained_units(arch, policy, trained):
    hf_config, task, *_ = ARCHS[arch]
    doc = dict(model="hf", hf_config=hf_config, task=task, units="blocks", policy=policy)
    cfg = user_data_config(**{**doc, "rounds": 1, **method_needs(policy)})
    res = fedbug.run(cfg, dataset=tokens())
    assert res.records[-1]["train_loss"] == res.records[-1]["train_loss"]  # not NaN
    start = trained[0][0]
    sent = set()
    for received, result, slices, _ in trained:
        assert torch.equal(received, start)
        assert any(result.trained)
        for u, s in enumerate(slices):
            moved = bool(result.delta[s].abs().sum() > 0)
            assert moved == result.trained[u], (u, result.trained)  # frozen units did not move
            if result.uploaded[u]:
                sent.add(u)
    if policy == "fixed_last_two":  # the checks bite: the head and the last block stay frozen
        assert all(result.trained[-2:] == [False, False] for _, result, _, _ in trained)
    for u, s in enumerate(trained[0][2]):  # no client sent it: the global unit is as it was
        if u not in sent:
            assert torch.equal(res.weights[s], start[s])


def test_flops_of_a_step_by_hand_and_what_freezing_blocks_saves():
    """GPT-2, d = 8, L = 2 blocks, T = 8 tokens, V = 12, a batch of N = 4. The forward pass's
    matmuls per sequence: per block 24 d^2 T (qkv 6, projection 2, MLP 8 + 8) and attention
    4 T^2 d (scores and their product with values), the head 2 d V (the last position only).
    Backward costs twice the forward where every weight trains; with the embedding and block 0
    frozen (block 1 and the head's norm train; the head's matrix is the embedding's), block 0
    needs no backward and the head only its input gradient."""
    d, L, N = 8, 2, 4
    block, head = 24 * d * d * T + 4 * T * T * d, 2 * d * V
    forward = L * block + head
    m = build("gpt2")
    x = torch.randint(0, V, (N, T))
    y = torch.randint(0, V, (N,))
    units = find_units(m, names=block_units(m, x))
    every = [p for u in units for p in u.params]
    full = training_cost(m, every, x, y, NextToken().loss)
    assert full.flops == N * 3 * forward
    top = [p for u in units[2:] for p in u.params]
    part = training_cost(m, top, x, y, NextToken().loss)
    assert part.flops == N * (forward + 2 * block + head)
    assert part.trained == 4 * sum(m.get_parameter(p).numel() for p in top)
    assert 0 < part.activations < full.activations


def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(tmp_path):
    """GPT-2's dropout draws (p = 0.1) repeat from (seed, round, client) across the resume."""
    cfg = user_data_config(
        model="hf", hf_config=GPT2, task="next_token", units="blocks", policy="bottom_up",
        rounds=3, checkpoint_every=1,
    )  # fmt: skip
    ds = tokens()
    full = run_experiment(cfg, tmp_path / "full", dataset=ds)
    run_experiment(cfg, tmp_path / "cut", dataset=ds, stop_after=2)
    resumed = run_experiment(cfg, tmp_path / "cut", dataset=ds, resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)
    assert torch.equal(resumed.weights, full.weights)


def test_a_saved_folder_loads_as_hf_path(tmp_path):
    saved = build("gpt2", seed=5)
    saved.save_pretrained(tmp_path / "tiny-gpt2")
    loaded = build_model("hf:" + str(tmp_path / "tiny-gpt2"), (T,), V, 0, task="next_token")
    assert type(loaded) is type(saved)
    for (n, p), q in zip(saved.named_parameters(), loaded.parameters()):
        assert torch.equal(p, q), n


def test_a_saved_classifier_gets_a_new_head_for_the_data_sets_classes(tmp_path):
    """Saved with 3 labels, loaded for the data set's 12: the encoder as saved, a new head."""
    saved = build_model("hf", (T,), 3, 5, hf_config=BERT, task="classification")
    saved.save_pretrained(tmp_path / "bert3")
    loaded = build_model("hf:" + str(tmp_path / "bert3"), (T,), V, 0, task="classification")
    assert loaded.classifier.out_features == V and loaded.config.num_labels == V
    for n, p in saved.bert.named_parameters():
        assert torch.equal(p, loaded.bert.get_parameter(n)), n


def test_a_model_not_on_this_machine_is_one_line_exit_2(tmp_path, capsys):
    doc = {**dict(dataset="digits", num_clients=4, clients_per_round=2, rounds=1, threads=1)}
    path = tmp_path / "c.yaml"
    path.write_text(
        "\n".join(f"{k}: {v}" for k, v in doc.items()) + "\nmodel: hf:no-such-org/no-model\n"
    )
    rc = main(["run", str(path), "--out", str(tmp_path / "o"), "-q"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    from huggingface_hub.constants import HF_HUB_CACHE

    for words in ("hf:no-such-org/no-model", HF_HUB_CACHE, "hf download no-such-org/no-model"):
        assert words in err[0]


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"model": "hf"}, "needs model_type"),
        ({"model": "mlp", "hf_config": GPT2}, "hf_config: has no effect under model: mlp"),
        ({"model": "hf", "hf_config": GPT2, "task": "regression"}, "no Hugging Face head"),
    ],
)
def test_configs_that_cannot_build_a_model_are_refused(doc, words):
    with pytest.raises(ConfigError, match=words):
        load_config(None, doc={"dataset": "digits", **doc})


def test_tokenised_data_from_hugging_face_datasets_trains_a_bert_classifier():
    """Token ids read from a ``datasets.Dataset`` column (``from_huggingface(...,
    inputs="tokens")``, the existing path) feed a BERT-shaped sequence classifier cut into
    blocks: one round of FedAvg, the ids kept as integers, every unit trained."""
    datasets = pytest.importorskip("datasets")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, V, (40, T), generator=g)
    labels = torch.randint(0, 3, (40,), generator=g)

    def split(lo: int, hi: int):
        return datasets.Dataset.from_dict(
            {"input_ids": ids[lo:hi].tolist(), "label": labels[lo:hi].tolist()}
        )

    ds = FederatedDataset.from_huggingface(
        "tok-hf", split(0, 32), split(32, 40), x="input_ids", y="label", inputs="tokens"
    )
    assert ds.train_x.dtype == torch.long and ds.train_x.shape == (32, T) and ds.num_classes == 3
    cfg = user_data_config(
        model="hf", hf_config=BERT, task="classification", units="blocks", rounds=1
    )
    res = fedbug.run(cfg, dataset=ds)
    assert res.records[0]["test_acc"] is not None
    assert all(res.records[0]["trained_sublayers"])
