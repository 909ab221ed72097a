"""synthetic: LEAF/FedProx Synthetic(alpha, beta): shapes, per-client sizes, labels, seeding."""

import numpy as np
import pytest
import torch

from fedbug.config import load_config
from fedbug.core.seeding import derive_seed
from fedbug.data import load_dataset
from fedbug.data.synthetic import CLASSES, DIM, client_sizes, generate
from fedbug.engine import run_experiment
from fedbug.errors import ConfigError


def test_shapes_and_per_client_sizes_follow_the_definition():
    ds = generate(num_clients=40, alpha=0.5, beta=0.5, seed=3)
    sizes = client_sizes(40, seed=3)
    # LEAF: floor(lognormal(4, 2)) + 50 samples; the first int(0.9 n) train, the rest test
    rng = np.random.default_rng(derive_seed(3, "synthetic-sizes"))
    np.testing.assert_array_equal(sizes, rng.lognormal(4, 2, 40).astype(np.int64) + 50)
    assert sizes.min() >= 50
    assert ds.train_x.shape == (int((0.9 * sizes).astype(int).sum()), DIM)
    assert ds.test_x.shape == (int(sizes.sum()) - len(ds.train_x), DIM)
    assert ds.train_x.dtype == torch.float32 and ds.input_shape == (DIM,)
    assert ds.num_classes == CLASSES and ds.inputs == "vector"
    assert [len(c) for c in ds.natural_clients] == list((0.9 * sizes).astype(int))
    assert torch.equal(torch.cat(ds.natural_clients), torch.arange(len(ds.train_x)))
    assert int(ds.train_y.min()) >= 0 and int(ds.train_y.max()) < CLASSES


def test_clients_differ_and_features_have_the_power_law_variance():
    ds = generate(num_clients=3, alpha=0.0, beta=0.0, seed=0, size_mu=8, size_sigma=0.1)
    x = ds.train_x[ds.natural_clients[0]]
    # x ~ N(v_k, diag(j^-1.2)): the within-client variance of feature j is j^-1.2
    var = x.double().var(0)
    expected = torch.arange(1, DIM + 1, dtype=torch.float64) ** -1.2
    torch.testing.assert_close(var, expected, rtol=0.15, atol=0.0)
    # non-IID: each client has its own W_k, so label mixes differ
    mixes = [torch.bincount(ds.train_y[c], minlength=CLASSES) for c in ds.natural_clients]
    assert not torch.equal(mixes[0], mixes[1])


def test_same_seed_same_data_and_iid_variant_shares_the_model():
    a, b = generate(num_clients=5, seed=1), generate(num_clients=5, seed=1)
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    c = generate(num_clients=5, seed=2)
    assert not torch.equal(a.train_x[:10], c.train_x[:10])
    iid = generate(num_clients=4, iid=True, seed=1, max_size=300)
    assert max(len(p) for p in iid.natural_clients) <= 270
    # Synthetic-IID: every client draws x ~ N(0, Sigma), however large beta
    wide = generate(num_clients=4, iid=True, seed=1, beta=5.0, max_size=300)
    for c in wide.natural_clients:
        assert wide.train_x[c, 0].mean().abs() < 4 / len(c) ** 0.5  # feature 0: sd 1


def test_options_from_the_config_and_a_logreg_run():
    ds = load_dataset("synthetic", None, {"alpha": 0.5, "max_size": 60}, num_clients=12)
    assert len(ds.natural_clients) == 12
    with pytest.raises(ConfigError, match="takes no dataset_options"):
        load_dataset("digits", None, {"alpha": 1.0})
    cfg = load_config(
        None,
        doc={
            "dataset": "synthetic",
            "dataset_options": {"alpha": 1.0, "beta": 1.0, "max_size": 80},
            "model": "logreg",
            "head_units": 0,  # one unit: all of it is the base
            "partition": "natural",
            "num_clients": 20,
            "clients_per_round": 5,
            "rounds": 2,
            "local_steps": 5,
            "batch_size": 10,
            "lr": 0.01,
            "threads": 1,
        },
    )
    res = run_experiment(cfg)
    assert res.summary["num_clients"] == 20 and res.summary["num_units"] == 1
    assert res.records[-1]["test_acc"] is not None
