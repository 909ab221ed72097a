"""FederatedDataset takes data as users have it (numpy arrays, lists, a per-client split, Hugging
Face columns) and refuses bad data with one DataError that names the problem and the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny import user_data_config
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import fedbug
from fedbug import DataError, FedbugError, FederatedDataset

DIM, CLASSES = 6, 4


class Net(nn.Module):
    """The user's model: two Linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.hidden = nn.Linear(DIM, 16)
        self.out = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def blobs(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Well separated Gaussian blobs as float64 numpy inputs and int32 labels."""
    rng = np.random.default_rng(seed)
    centers = np.eye(CLASSES, DIM) * 6.0
    y = (np.arange(n) % CLASSES).astype(np.int32)
    return centers[y] + rng.normal(size=(n, DIM)), y


def numpy_dataset(**kwargs: object) -> FederatedDataset:
    x, y = blobs(96)
    xt, yt = blobs(40, seed=1)
    return FederatedDataset("np", x, y, xt, yt, num_classes=CLASSES, scale=1.0, **kwargs)


# -- numpy and lists -------------------------------------------------------------------------


def test_numpy_inputs_become_float32_and_labels_int64() -> None:
    ds = numpy_dataset()
    assert ds.train_x.dtype == torch.float32 and ds.test_x.dtype == torch.float32
    assert ds.train_y.dtype == torch.int64 and ds.test_y.dtype == torch.int64
    x, y = blobs(96)
    assert torch.allclose(ds.train_x, torch.from_numpy(x).float())
    assert ds.train_y.tolist() == y.tolist()
    assert ds.input_shape == (DIM,)


def test_plain_lists_and_a_label_column_are_accepted() -> None:
    ds = FederatedDataset(
        "lists", [[0, 1], [2, 3], [4, 5]], [[0], [1], [1]], [[1.5, 2.5]], [0.0], 2, scale=1.0
    )
    assert ds.train_x.shape == (3, 2) and ds.test_x.dtype == torch.float32
    assert ds.train_y.tolist() == [0, 1, 1] and ds.test_y.tolist() == [0]
    assert ds.test_y.dtype == torch.int64


def test_uint8_images_and_tensors_keep_their_behaviour() -> None:
    x = torch.randint(0, 256, (10, 1, 4, 4), dtype=torch.uint8)
    y = torch.arange(10, dtype=torch.uint8) % 3
    ds = FederatedDataset("img", x, y, x[:4], y[:4], 3, mean=(0.5,), std=(0.25,))
    assert ds.train_x is x  # tensors are kept, not copied
    assert ds.train_y.dtype == torch.int64
    assert torch.allclose(ds.prepare(x[:2]), (x[:2].float() / 255 - 0.5) / 0.25)


def test_tokens_inputs_are_kept_as_ids() -> None:
    x = np.array([[1, 2, 3], [4, 5, 6]])
    ds = FederatedDataset("tok", x, [0, 1], x, [1, 0], 7, inputs="tokens")
    assert ds.prepare(ds.train_x).dtype == torch.int64
    assert ds.prepare(ds.train_x).tolist() == x.tolist()


def test_numpy_data_trains_through_a_real_run(no_plots) -> None:
    ds = numpy_dataset()
    result = fedbug.run(user_data_config(), model=Net, dataset=ds)
    assert [r["round"] for r in result.records] == [1, 2]
    acc = result.summary["final_acc"]
    assert isinstance(acc, float) and acc > 0.5  # chance is 0.25; the blobs are well separated
    assert torch.isfinite(result.weights).all()


# -- one DataError per bad input -------------------------------------------------------------


def make(**changes: object) -> FederatedDataset:
    x, y = blobs(20)
    xt, yt = blobs(8, seed=1)
    args = dict(name="bad", train_x=x, train_y=y, test_x=xt, test_y=yt, num_classes=CLASSES)
    args.update(changes)
    return FederatedDataset(**args)  # type: ignore[arg-type]


def test_data_error_is_a_fedbug_error_with_exit_code_2() -> None:
    assert issubclass(DataError, FedbugError) and DataError.exit_code == 2


def test_inputs_and_labels_of_different_lengths() -> None:
    with pytest.raises(DataError, match=r"train set has 20 inputs but 19 labels"):
        make(train_y=blobs(20)[1][:19])
    with pytest.raises(DataError, match=r"test set has 8 inputs but 9 labels"):
        make(test_y=np.zeros(9, dtype=int))


def test_labels_that_are_not_whole_numbers() -> None:
    y = blobs(20)[1].astype(float)
    y[3] = 1.5
    with pytest.raises(DataError, match=r"train labels are not whole numbers .*1\.5 at index 3"):
        make(train_y=y)
    ok = make(train_y=blobs(20)[1].astype(np.float64))  # whole floats are class indices
    assert ok.train_y.dtype == torch.int64 and ok.train_y.tolist() == blobs(20)[1].tolist()


def test_labels_outside_the_classes() -> None:
    y = blobs(20)[1].copy()
    y[0], y[5] = -1, 7
    with pytest.raises(DataError, match=r"train labels run from -1 to 7, outside 0\.\.3"):
        make(train_y=y)
    with pytest.raises(DataError, match=r"test labels run from 0 to 3, outside 0\.\.2 .*=3"):
        make(num_classes=3, train_y=blobs(20)[1] % 3)


def test_text_labels_say_how_to_number_them() -> None:
    with pytest.raises(DataError, match=r"train labels hold text.*np\.unique"):
        make(train_y=np.array(["cat", "dog"] * 10))


def test_one_hot_labels_say_argmax() -> None:
    with pytest.raises(DataError, match=r"shape 20x4.*argmax"):
        make(train_y=np.eye(CLASSES)[blobs(20)[1]])


def test_nan_and_infinite_inputs_are_counted() -> None:
    x = blobs(20)[0]
    x[2, 0] = np.nan
    x[2, 1] = np.inf
    x[9, 4] = -np.inf
    with pytest.raises(
        DataError, match=r"train inputs hold 3 non-finite value\(s\) \(1 NaN, 2 infinite\) in 2"
    ):
        make(train_x=x)
    xt = blobs(8, seed=1)[0].astype(np.float32)
    xt[5, 5] = np.nan
    with pytest.raises(DataError, match=r"test inputs hold 1 .*first at index 5"):
        make(test_x=xt)


def test_nan_labels_are_refused() -> None:
    y = blobs(20)[1].astype(float)
    y[4] = np.nan
    with pytest.raises(DataError, match=r"train labels hold 1 non-finite"):
        make(train_y=y)


def test_train_and_test_samples_of_different_shapes() -> None:
    with pytest.raises(DataError, match=r"train samples have shape 6 but test samples 2x3"):
        make(test_x=blobs(8)[0].reshape(8, 2, 3))


def test_an_empty_train_set() -> None:
    with pytest.raises(DataError, match=r"train set is empty"):
        make(train_x=np.zeros((0, DIM)), train_y=np.zeros(0, dtype=int))


def test_num_classes_below_one() -> None:
    with pytest.raises(DataError, match=r"num_classes=0; give the number of classes"):
        make(num_classes=0)
    with pytest.raises(DataError, match=r"num_classes=2\.5 is not a whole number"):
        make(num_classes=2.5)


def test_ragged_inputs() -> None:
    with pytest.raises(DataError, match=r"train inputs are not one rectangular array"):
        make(train_x=[[1.0, 2.0], [3.0]], train_y=[0, 1])


def test_values_labels_skip_the_class_checks_but_not_nan() -> None:
    y = blobs(20)[0][:, :2]  # two real-valued targets per sample
    ds = make(train_y=y, test_y=blobs(8)[0][:, :2], labels="values", num_classes=2)
    assert ds.train_y.dtype == torch.float32 and ds.train_y.shape == (20, 2)
    assert torch.allclose(ds.train_y, torch.from_numpy(y).float())
    y[1, 1] = np.nan
    with pytest.raises(DataError, match=r"train labels hold 1 non-finite"):
        make(train_y=y, labels="values", num_classes=2)
    with pytest.raises(DataError, match=r"labels='regression'"):
        make(labels="regression")


def test_checks_stay_cheap_on_a_large_image_set() -> None:
    import time

    x = torch.zeros(60_000, 28, 28, dtype=torch.uint8)
    y = torch.arange(60_000) % 10
    start = time.perf_counter()
    ds = FederatedDataset("big", x, y, x[:10_000], y[:10_000], 10)
    assert time.perf_counter() - start < 1.0
    assert ds.train_x is x


# -- a user's per-client split ---------------------------------------------------------------


def client_pairs(sizes: list[int], seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    return [blobs(n, seed=seed + i) for i, n in enumerate(sizes)]


def test_from_clients_with_pairs_sets_each_clients_index_range() -> None:
    clients = client_pairs([10, 7, 12, 5])
    ds = FederatedDataset.from_clients("mine", clients, test=blobs(20, seed=9))
    assert [p.tolist() for p in ds.natural_clients] == [
        list(range(0, 10)),
        list(range(10, 17)),
        list(range(17, 29)),
        list(range(29, 34)),
    ]
    assert ds.natural_test_clients is None
    assert ds.num_classes == CLASSES and ds.scale == 1.0
    for (x, y), part in zip(clients, ds.natural_clients, strict=True):
        assert torch.allclose(ds.train_x[part], torch.from_numpy(x).float())
        assert ds.train_y[part].tolist() == y.tolist()
    assert len(ds.test_y) == 20


def test_from_clients_with_tensor_datasets_and_per_client_tests() -> None:
    clients = [
        TensorDataset(torch.from_numpy(x).float(), torch.from_numpy(y).long())
        for x, y in client_pairs([8, 9, 10, 11])
    ]
    tests = client_pairs([3, 0, 2, 4], seed=20)
    ds = FederatedDataset.from_clients("mine", clients, test=tests)
    assert [len(p) for p in ds.natural_clients] == [8, 9, 10, 11]
    assert ds.natural_clients[2].tolist() == list(range(17, 27))
    assert [p.tolist() for p in ds.natural_test_clients] == [[0, 1, 2], [], [3, 4], [5, 6, 7, 8]]
    assert ds.test_y.tolist() == np.concatenate([y for _, y in tests]).tolist()


class Items(Dataset):
    """A map-style Dataset of (list, int) items, as a user's own class might be."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> tuple[list[float], int]:
        return self.x[i].tolist(), int(self.y[i])


def test_from_clients_stacks_a_datasets_items() -> None:
    (x, y), (x2, y2) = client_pairs([5, 6])
    ds = FederatedDataset.from_clients("items", [Items(x, y), (x2, y2)], test=blobs(8))
    assert ds.train_x.shape == (11, DIM)
    assert torch.allclose(ds.train_x[:5], torch.from_numpy(x).float())
    assert ds.train_y.tolist() == [*y.tolist(), *y2.tolist()]
    assert ds.natural_clients[1].tolist() == list(range(5, 11))


def test_from_clients_runs_with_the_natural_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    clients = client_pairs([24, 20, 28, 16])
    tests = client_pairs([6, 5, 7, 4], seed=30)
    ds = FederatedDataset.from_clients("mine", clients, test=tests)
    cfg = user_data_config(partition="natural")
    exp = fedbug.Experiment(cfg, dataset=ds, model=Net)
    assert [p.tolist() for p in exp.parts] == [p.tolist() for p in ds.natural_clients]
    assert [p.tolist() for p in exp.test_parts] == [p.tolist() for p in ds.natural_test_clients]
    result = fedbug.run(cfg, model=Net, dataset=ds)
    assert [r["round"] for r in result.records] == [1, 2]
    assert result.summary["final_acc"] > 0.5


def test_from_clients_num_classes_and_scale_defaults() -> None:
    x = np.zeros((4, 2, 2), dtype=np.uint8)
    ds = FederatedDataset.from_clients("u8", [(x, [0, 1, 2, 1])], test=(x[:1], [5]))
    assert ds.num_classes == 6  # largest label (in the test set) + 1
    assert ds.scale == 255.0
    given = FederatedDataset.from_clients(
        "u8", [(x, [0, 1, 2, 1])], test=(x, [0] * 4), num_classes=10, scale=2.0
    )
    assert given.num_classes == 10 and given.scale == 2.0


def test_from_clients_errors() -> None:
    clients = client_pairs([5, 6])
    with pytest.raises(DataError, match=r"a test set is needed.*test=\(test_x, test_y\)"):
        FederatedDataset.from_clients("mine", clients)
    with pytest.raises(DataError, match=r"client 1 has no samples"):
        FederatedDataset.from_clients(
            "mine", [clients[0], (np.zeros((0, DIM)), []), clients[1]], test=blobs(4)
        )
    with pytest.raises(DataError, match=r"client 1 has 6 inputs but 5 labels"):
        FederatedDataset.from_clients(
            "mine", [clients[0], (clients[1][0], clients[1][1][:5])], test=blobs(4)
        )
    with pytest.raises(DataError, match=r"client 1 has samples of shape 3 but client 0 has 6"):
        FederatedDataset.from_clients(
            "mine", [clients[0], (np.zeros((2, 3)), [0, 1])], test=blobs(4)
        )
    with pytest.raises(DataError, match=r"test lists 3 test sets but there are 2 clients"):
        FederatedDataset.from_clients("mine", clients, test=client_pairs([2, 2, 2]))
    with pytest.raises(DataError, match=r"no client has a test sample"):
        FederatedDataset.from_clients(
            "mine", clients, test=[(np.zeros((0, DIM)), []), (np.zeros((0, DIM)), [])]
        )
    with pytest.raises(DataError, match=r"clients must be a list"):
        FederatedDataset.from_clients("mine", TensorDataset(torch.zeros(2, 2)), test=blobs(4))
    with pytest.raises(DataError, match=r"client 0 is a dict"):
        FederatedDataset.from_clients("mine", [{"x": 1}], test=blobs(4))
    with pytest.raises(DataError, match=r"train labels run from -2 to 3"):
        FederatedDataset.from_clients("mine", [(np.zeros((2, DIM)), [-2, 3])], test=blobs(4))
    with pytest.raises(DataError, match=r"labels='values' give num_classes="):
        FederatedDataset.from_clients("mine", clients, test=blobs(4), labels="values")


# -- Hugging Face ----------------------------------------------------------------------------


def test_from_huggingface_reads_columns() -> None:
    datasets = pytest.importorskip("datasets")
    x, y = blobs(12)
    xt, yt = blobs(6, seed=1)

    def split(x: np.ndarray, y: np.ndarray):
        return datasets.Dataset.from_dict(
            {"a": x[:, 0], "b": x[:, 1], "vec": x[:, 2:].tolist(), "label": y.tolist()}
        )

    train, test = split(x, y), split(xt, yt)
    one = FederatedDataset.from_huggingface("hf", train, test, x="vec", y="label")
    assert one.train_x.shape == (12, DIM - 2) and one.num_classes == CLASSES
    assert torch.allclose(one.train_x, torch.from_numpy(x[:, 2:]).float())
    both = FederatedDataset.from_huggingface("hf", train, test, x=["a", "b", "vec"], y="label")
    assert both.train_x.shape == (12, DIM) and both.train_x.dtype == torch.float32
    assert torch.allclose(both.test_x, torch.from_numpy(xt).float())
    assert both.train_y.tolist() == y.tolist() and both.scale == 1.0

    labelled = train.cast_column("label", datasets.ClassLabel(num_classes=9))
    ds = FederatedDataset.from_huggingface("hf", labelled, test, x="vec", y="label")
    assert ds.num_classes == 9  # a ClassLabel column gives its class count
    with pytest.raises(DataError, match=r"no column\(s\) \['label2'\]; its columns are"):
        FederatedDataset.from_huggingface("hf", train, test, x="vec", y="label2")
    with pytest.raises(DataError, match=r"DatasetDict .*train=dd\['train'\]"):
        dd = datasets.DatasetDict({"train": train, "test": test})
        FederatedDataset.from_huggingface("hf", dd, test, x="vec", y="label")


def test_from_huggingface_without_datasets_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DataError, match=r"pip install 'fedbug\[hf\]'"):
        FederatedDataset.from_huggingface("hf", None, None, x="x", y="y")
