"""The Python API refuses what cannot train, up front: an empty test set, normalisation that
divides by zero, a model that does not fit the data, a boolean class count, a forward pass that
reads a layer's weights without calling the layer. Each is one error line naming the problem
and the fix, raised before the run folder (or the folder above it) exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny import user_data_config
from torch import nn

import fedbug
from fedbug import DataError, FederatedDataset
from fedbug.errors import ConfigError

DIM, CLASSES = 6, 4


def blobs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs: float64 inputs of DIM features, CLASSES classes."""
    rng = np.random.default_rng(seed)
    y = np.arange(n) % CLASSES
    return np.eye(CLASSES, DIM)[y] * 6.0 + rng.normal(size=(n, DIM)), y


def dataset(**kwargs: object) -> FederatedDataset:
    x, y = blobs(64)
    xt, yt = blobs(24, seed=1)
    values: dict[str, object] = dict(test_x=xt, test_y=yt, num_classes=CLASSES, scale=1.0)
    values.update(kwargs)
    tx, ty = values.pop("test_x"), values.pop("test_y")
    return FederatedDataset("blobs", x, y, tx, ty, **values)  # type: ignore[arg-type]


def mlp(inputs: int = DIM, outputs: int = CLASSES):
    return lambda: nn.Sequential(nn.Linear(inputs, 16), nn.ReLU(), nn.Linear(16, outputs))


def refused(tmp_path, error: type[Exception] = ConfigError, cfg=None, **sources: object) -> str:
    """The one-line message ``fedbug.run`` refuses with; nothing is left on disk (the run
    folder and the ``--out``-like folder above it are not made)."""
    out = tmp_path / "out"
    with pytest.raises(error) as e:
        fedbug.run(cfg or user_data_config(), out / "run", **sources)
    message = str(e.value)
    assert "\n" not in message
    assert not out.exists(), sorted(p.name for p in out.rglob("*"))
    return message


# -- 1. an empty test set ------------------------------------------------------------------------


def test_an_empty_test_set_is_refused_before_the_run_folder_is_made(tmp_path):
    # before: accepted; round 1 trained, then evaluation raised KeyError: 'correct' and left
    # config.yaml, metrics.jsonl and partition files behind
    data = dataset(test_x=np.zeros((0, DIM)), test_y=np.zeros(0, dtype=np.int64))
    message = refused(tmp_path, model=mlp(), dataset=data)
    assert "'blobs'" in message and "no test samples" in message
    assert "test_x" in message and "pfl_test: holdout" in message  # the fixes


def test_a_run_without_a_run_folder_refuses_an_empty_test_set_too():
    data = dataset(test_x=np.zeros((0, DIM)), test_y=np.zeros(0, dtype=np.int64))
    with pytest.raises(ConfigError, match="no test samples"):
        fedbug.run(user_data_config(), model=mlp(), dataset=data)


def test_held_out_train_samples_stand_in_for_an_empty_test_set(tmp_path):
    # the fix the message offers works: each client's held-out samples become the test set
    data = dataset(test_x=np.zeros((0, DIM)), test_y=np.zeros(0, dtype=np.int64))
    result = fedbug.run(user_data_config(rounds=1, pfl_test="holdout"), model=mlp(), dataset=data)
    assert 0.0 <= result.summary["final_acc"] <= 1.0


# -- 2. normalisation that divides by zero or is not a number ------------------------------------


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"std": (0.0,)}, "std"),
        ({"std": (1.0, 0.0, 1.0, 1.0, 1.0, 1.0)}, "std"),
        ({"std": (-1.0,)}, "std"),
        ({"std": (float("inf"),)}, "std"),
        ({"scale": 0.0}, "scale"),
        ({"scale": float("nan")}, "scale"),
        ({"scale": -255.0}, "scale"),
        ({"mean": (float("nan"),)}, "mean"),
        ({"mean": (0.0, 0.0, 0.0)}, "mean"),  # 3 values for 6 features
        ({"std": ()}, "std"),
    ],
)
def test_normalisation_that_cannot_work_is_refused_naming_the_key(options, key):
    # before: accepted, and the run "diverged in round 1 ... the learning rate is likely too
    # high (lr=0.1)"
    with pytest.raises(DataError) as e:
        dataset(**options)
    message = str(e.value)
    assert f"{key}=" in message and "'blobs'" in message and "\n" not in message


def test_from_clients_checks_normalisation_too():
    x, y = blobs(16)
    with pytest.raises(DataError, match="scale="):
        FederatedDataset.from_clients("split", [(x[:8], y[:8]), (x[8:], y[8:])], (x, y), scale=0)


def test_per_feature_normalisation_of_the_right_length_is_taken():
    data = dataset(mean=(0.0,) * DIM, std=(2.0,) * DIM, scale=2.0)
    assert torch.allclose(data.prepare(torch.full((1, DIM), 4.0)), torch.ones(1, DIM))


# -- 3. a model that does not fit the data -------------------------------------------------------


def test_a_model_whose_input_layer_does_not_fit_the_samples_is_refused(tmp_path):
    # before: torch's "mat1 and mat2 shapes cannot be multiplied (2x6 and 5x16)"
    message = refused(tmp_path, model=mlp(inputs=5), dataset=dataset())
    assert "layer 0 (Linear)" in message and "5 features" in message
    assert "shape 6" in message and "nn.Linear(6, 16)" in message


def test_a_model_with_fewer_outputs_than_classes_is_refused(tmp_path):
    # before: "IndexError: Target 3 is out of bounds." in round 1, a half-made run folder
    message = refused(tmp_path, model=mlp(outputs=3), dataset=dataset())
    assert "3 outputs" in message and "num_classes=4" in message and "4 outputs" in message


def test_a_model_with_more_outputs_than_classes_is_refused(tmp_path):
    # before: accepted (cross-entropy over 7 scores, 3 of them for classes that do not exist)
    message = refused(tmp_path, model=mlp(outputs=7), dataset=dataset())
    assert "7 outputs" in message and "num_classes=4" in message


def test_a_convolution_with_other_channels_than_the_images_is_refused(tmp_path):
    x = torch.randint(0, 256, (32, 1, 8, 8), dtype=torch.uint8)
    y = torch.arange(32) % 2
    data = FederatedDataset("gray", x, y, x[:8], y[:8], num_classes=2)

    def net() -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))

    message = refused(tmp_path, model=net, dataset=data)
    assert "layer 0 (Conv2d)" in message and "3 channel(s)" in message
    assert "1x8x8" in message and "nn.Conv2d(1, " in message


def test_a_regression_model_with_the_wrong_number_of_outputs_is_refused(tmp_path):
    x, _ = blobs(32)
    y = x.sum(1)
    data = FederatedDataset("sums", x, y, x[:8], y[:8], num_classes=1, scale=1.0, labels="values")
    message = refused(tmp_path, model=mlp(outputs=2), dataset=data, task="regression")
    assert "2 outputs" in message and "1 target" in message


def test_a_model_whose_forward_fails_otherwise_names_the_layer_and_torchs_words(tmp_path):
    class Reshaper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(DIM, CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x.view(-1, 4, 4))  # 6 features do not make 4x4

    message = refused(tmp_path, model=Reshaper, dataset=dataset())
    assert "Reshaper" in message and "its forward pass" in message and "shape 6" in message
    assert "RuntimeError: shape '[-1, 4, 4]' is invalid for input of size 12" in message


def test_a_model_without_parameters_is_refused(tmp_path):
    message = refused(tmp_path, model=nn.Identity(), dataset=dataset())
    assert "no parameters" in message


def test_a_fitting_model_built_in_or_own_still_runs(tmp_path):
    result = fedbug.run(user_data_config(rounds=1), model=mlp(), dataset=dataset())
    assert 0.0 <= result.summary["final_acc"] <= 1.0


# -- 4. booleans where a whole number is expected ------------------------------------------------


@pytest.mark.parametrize("value", [True, False, np.bool_(True)])
def test_a_boolean_class_count_is_refused(value):
    # before: num_classes=True was taken as 1 class
    with pytest.raises(DataError, match=r"num_classes=.*(True|False).* is a boolean"):
        dataset(num_classes=value)


def test_a_numpy_class_count_is_taken():
    assert dataset(num_classes=np.int64(CLASSES)).num_classes == CLASSES


@pytest.mark.parametrize("value", [True, 1.0, "2"])
def test_stop_after_must_be_a_whole_number(tmp_path, value):
    message = refused(tmp_path, model=mlp(), dataset=dataset(), stop_after=value)
    assert "stop_after" in message


# -- 5. a forward pass that reads a layer's weights without calling it ---------------------------


class RawHead(nn.Module):
    """Calls ``hidden`` but multiplies by ``fc.weight`` itself: tracing never sees ``fc``."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(DIM, 16)
        self.fc = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.hidden(x)) @ self.fc.weight.T + self.fc.bias


class RawOnly(nn.Module):
    """Calls no submodule at all (before: IndexError: list index out of range)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(DIM, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.fc.weight.T + self.fc.bias


@pytest.mark.parametrize("model", [RawHead, RawOnly])
def test_weights_read_without_calling_their_layer_are_named(tmp_path, model):
    message = refused(tmp_path, model=model, dataset=dataset())
    assert "fc.weight, fc.bias" in message and "fc" in message
    assert "self.fc(x)" in message and "units:" in message  # both fixes


def test_listing_the_units_runs_such_a_model(tmp_path):
    # the second fix the message offers works
    cfg = user_data_config(rounds=1, units=["fc"])
    result = fedbug.run(cfg, tmp_path / "run", model=RawOnly, dataset=dataset())
    assert result.summary["units"] == ["fc"]


def test_the_command_line_reports_a_built_in_model_that_does_not_fit_in_one_line(tmp_path, capsys):
    # before: an IndexError traceback ("index out of range in self") from the LSTM's
    # embedding fed synthetic's real-valued features
    from fedbug.cli import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "name: c\ndataset: synthetic\nmodel: shakespeare_lstm\nrounds: 1\nnum_clients: 2\n"
        "clients_per_round: 2\nlocal_steps: 1\ncount_flops: false\n"
    )
    code = main(["run", str(cfg), "--out", str(tmp_path / "out"), "-q"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("fedbug: error: ") and err.count("\n") == 1, err
    assert "embedding (Embedding)" in err and "token ids" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("key", ["rounds", "num_clients", "seed", "lr", "clients_per_round"])
def test_a_boolean_for_a_number_in_a_config_is_refused(key):
    """``rounds: true`` was taken as 1 round (pydantic reads a boolean as 0 or 1)."""
    with pytest.raises(ConfigError, match=f"{key}=true is a boolean; give a number"):
        fedbug.config(**{key: True})
