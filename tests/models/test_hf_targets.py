"""``targets: every``: a causal LM trained on the token after every position of its window
(fedbug.data.targets, the Hugging Face head on every position), evaluated as before on the token
after each test sequence; hand-worked targets, one local step against the gradient of the mean
cross-entropy over every position, and one-line refusals."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from tiny import user_data_config

from fedbug.config import load_config
from fedbug.data import FederatedDataset
from fedbug.data.targets import every_position_targets
from fedbug.engine import run_experiment
from fedbug.engine.experiment import Experiment
from fedbug.errors import ConfigError
from fedbug.models import build_model

transformers = pytest.importorskip("transformers")

V, T, N = 12, 8, 24
GPT2 = {"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, "n_positions": T,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}  # fmt: skip


def tokens(dtype: torch.dtype = torch.uint8) -> FederatedDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (N, T), generator=g).to(dtype)
    y = torch.randint(0, V, (N,), generator=g)
    return FederatedDataset("tok", x, y, x[:16], y[:16], V, inputs="tokens")


def test_every_positions_target_is_the_next_token_then_the_sequences_own():
    x = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.uint8)
    ds = FederatedDataset("t", x, torch.tensor([7, 8]), x, torch.tensor([9, 10]), 11,
                          inputs="tokens")  # fmt: skip
    out = every_position_targets(ds)
    assert out.train_y.tolist() == [[2, 3, 7], [5, 6, 8]]
    assert out.train_y.dtype == torch.uint8  # the tokens' type: no more memory than the windows
    assert out.test_y.tolist() == [9, 10] and ds.train_y.tolist() == [7, 8]  # ds unchanged


def test_every_position_is_refused_on_data_that_is_not_tokens():
    x = torch.zeros(4, 1, 2, 2, dtype=torch.uint8)
    images = FederatedDataset("img", x, torch.zeros(4, dtype=torch.long), x,
                              torch.zeros(4, dtype=torch.long), 2)  # fmt: skip
    with pytest.raises(ConfigError, match="targets: every predicts .* token sequence"):
        every_position_targets(images)


def test_the_head_scores_every_position_only_under_every():
    x = torch.zeros(3, T, dtype=torch.long)
    last = build_model("hf", (T,), V, 0, hf_config=GPT2, task="next_token")
    every = build_model("hf", (T,), V, 0, hf_config=GPT2, task="next_token", targets="every")
    assert last(x).shape == (3, V) and every(x).shape == (3, T, V)


def test_one_local_step_follows_the_mean_loss_over_every_position():
    """One client, one step on all its samples, plain SGD: the update is -lr times the gradient
    of the cross-entropy averaged over every position's next token; the round's test accuracy
    is the last position's, on one target a test sequence."""
    ds = tokens()
    cfg = user_data_config(model="hf", hf_config=GPT2, task="next_token", targets="every",
                           num_clients=1, clients_per_round=1, rounds=1, local_steps=1,
                           batch_size=N, weight_decay=0.0, momentum=0.0, lr=0.5)  # fmt: skip
    exp = Experiment(cfg, dataset=ds)
    start = exp.initial_weights()
    model = copy.deepcopy(exp.template)
    flat = exp.space.bind(model)
    assert torch.equal(flat, start)
    x = ds.train_x.long()
    targets = torch.cat([x[:, 1:], ds.train_y.unsqueeze(1)], 1)
    F.cross_entropy(model(x).reshape(-1, V), targets.reshape(-1)).backward()
    expected = start.clone()
    for name, off, n, _shape, _u in exp.space.param_slots():
        expected[off : off + n] -= 0.5 * model.get_parameter(name).grad.reshape(-1)
    res = run_experiment(cfg, dataset=ds)
    assert torch.allclose(res.weights, expected, atol=1e-6)
    assert not torch.allclose(res.weights, start, atol=1e-3)  # the step moved the weights
    flat.copy_(res.weights)
    with torch.no_grad():
        logits = model(ds.test_x.long())[:, -1]
    acc = float((logits.argmax(1) == ds.test_y).float().mean())
    assert res.records[-1]["test_acc"] == pytest.approx(acc)


def test_a_run_folder_plots_the_partition_by_each_sequences_own_target(tmp_path):
    cfg = user_data_config(model="hf", hf_config=GPT2, task="next_token", targets="every",
                           rounds=1, local_steps=1)  # fmt: skip
    res = run_experiment(cfg, tmp_path / "run", dataset=tokens())
    assert (tmp_path / "run" / "summary.json").exists() and res.records[-1]["test_acc"] >= 0


def test_clients_own_test_sets_score_the_token_after_each_sequence():
    """Natural clients with test samples of their own (LEAF's roles): acc_client_mean beside
    the global accuracy, both on the last position's scores."""
    ds, g = tokens(), torch.Generator().manual_seed(1)
    clients = [(ds.train_x[i : i + 6], ds.train_y[i : i + 6]) for i in range(0, N, 6)]
    tests = [(ds.train_x[i : i + 3], torch.randint(0, V, (3,), generator=g)) for i in range(4)]
    natural = FederatedDataset.from_clients("roles", clients, test=tests, num_classes=V,
                                            inputs="tokens")  # fmt: skip
    cfg = user_data_config(model="hf", hf_config=GPT2, task="next_token", targets="every",
                           partition="natural", rounds=1, local_steps=1)  # fmt: skip
    last = run_experiment(cfg.model_copy(update={"targets": "last"}), dataset=natural)
    res = run_experiment(cfg, dataset=natural)
    assert 0 <= res.records[-1]["acc_client_mean"] <= 1
    assert set(res.records[-1]) == set(last.records[-1])


@pytest.mark.parametrize(
    "over, message",
    [
        ({"task": "classification"}, "targets: every trains on the token after each position"),
        ({"algorithm": "feddecorr"}, "algorithm feddecorr reads one feature row a sample"),
        ({"dp_sgd": {}}, "dp_sgd: .*position embedding"),  # Opacus on GPT-2: one row of ids
    ],
)
def test_config_refusals_are_one_line(over, message):
    doc = {"model": "hf", "hf_config": GPT2, "task": "next_token", "targets": "every", **over}
    with pytest.raises(ConfigError, match=message):
        load_config(None, doc=doc)


def test_a_model_scoring_one_position_is_refused_naming_targets():
    cfg = user_data_config(model="shakespeare_lstm", task="next_token", targets="every")
    with pytest.raises(ConfigError, match=r"targets: every: a model that scores every position"):
        Experiment(cfg, dataset=tokens())


@pytest.mark.parametrize("targets", ["last", "every"])
def test_an_image_augmentation_on_token_sequences_is_refused(targets):
    cfg = user_data_config(model="hf", hf_config=GPT2, task="next_token", targets=targets,
                           augment="flip")  # fmt: skip
    with pytest.raises(ConfigError, match="augment: flip transforms images.*augment: none"):
        Experiment(cfg, dataset=tokens())


def test_the_attack_on_a_recorded_hugging_face_run_is_one_line(tmp_path):
    """fedbug attack inverts images and vectors: a Hugging Face model's recorded update (token
    sequences) is refused in one line naming the model, not a misleading hf_config error."""
    from fedbug.attack.driver import build_attacked_model
    from fedbug.results.updates import load_update, recorded

    cfg = user_data_config(model="hf", hf_config=GPT2, task="next_token", rounds=1,
                           local_steps=1, record_updates=[1])  # fmt: skip
    run_experiment(cfg, tmp_path / "run", dataset=tokens())
    client = recorded(tmp_path / "run")[1][0]
    with pytest.raises(ConfigError, match=r"Hugging Face model \(hf\) on token sequences"):
        build_attacked_model(load_update(tmp_path / "run", 1, client), cfg)
