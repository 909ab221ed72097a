"""Corrupt inputs, end to end: a truncated IDX file, a CIFAR batch with a wrong array size, a
LEAF JSON whose ``num_samples`` disagrees with its data, a Tiny-ImageNet folder with an
unreadable JPEG, a checkpoint from another config or model, a checkpoint with a flipped byte.
Each is refused by ``fedbug run`` with one line naming the file and the problem, exit code 2,
no traceback, and nothing written (``--out`` left empty, a resumed run folder byte for byte as
it was). The loader-level checks these rest on are in the other tests of this folder; the ones
added with them (LEAF's unlisted users and Shakespeare's input length, a checkpoint's contents
against the model) are tested here too."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from fedbug.cli import main
from fedbug.config import load_config
from fedbug.data import leaf
from fedbug.data.idx import write_idx
from fedbug.engine import run_experiment
from fedbug.errors import CheckpointError, DataError
from fedbug.results import RunDir, load_checkpoint_file

RUN = {
    "model": "mlp",
    "num_clients": 2,
    "clients_per_round": 2,
    "rounds": 1,
    "local_steps": 1,
    "batch_size": 4,
    "eval_batch_size": 64,
    "count_flops": False,
    "threads": 1,
    "partition": "iid",
    "min_client_samples": 0,
}


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_plots):
    """An empty HOME (only the files a test writes are found, no cache is kept), no plots."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


# -- small data sets in their official formats -------------------------------------------------


def write_mnist(folder: Path) -> Path:
    """MNIST's four IDX files; returns the train images, which the caller corrupts."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 16), ("t10k", 8)):
        write_idx(
            folder / f"{split}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28), np.uint8)
        )
        write_idx(folder / f"{split}-labels-idx1-ubyte", rng.integers(0, 10, n, np.uint8))
    return folder / "train-images-idx3-ubyte"


def write_cifar10(folder: Path) -> Path:
    """cifar-10-batches-py; returns data_batch_3, which the caller corrupts."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        batch = {
            b"labels": rng.integers(0, 10, 4).tolist(),
            b"data": rng.integers(0, 256, (4, 3072), np.uint8),
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {b"label_names": [f"c{i}".encode() for i in range(10)]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return folder / "data_batch_3"


def femnist_obj(users: dict[str, int], seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    data = {
        u: {"x": (rng.integers(0, 256, (n, 784)) / 255).tolist(), "y": [1] * n}
        for u, n in users.items()
    }
    return {"users": list(users), "num_samples": list(users.values()), "user_data": data}


def write_femnist(folder: Path) -> Path:
    """LEAF's data/train and data/test; returns the train file, which the caller corrupts."""
    for split, users in (("train", {"f0001": 4, "f0002": 3}), ("test", {"f0001": 2})):
        (folder / "data" / split).mkdir(parents=True, exist_ok=True)
        obj = femnist_obj(users)
        (folder / "data" / split / f"all_data_0_{split}.json").write_text(json.dumps(obj))
    return folder / "data" / "train" / "all_data_0_train.json"


def write_tiny_imagenet(folder: Path) -> Path:
    """tiny-imagenet-200 with two classes; returns a training JPEG, which the caller corrupts."""
    root = folder / "tiny-imagenet-200"
    wnids = ["n01443537", "n01629819"]
    (root / "val" / "images").mkdir(parents=True)
    (root / "wnids.txt").write_text("".join(w + "\n" for w in wnids))
    lines = []
    for label, wnid in enumerate(wnids):
        images = root / "train" / wnid / "images"
        images.mkdir(parents=True)
        for k in range(2):
            Image.new("RGB", (64, 64), (80 * label, 40 * k, 9)).save(images / f"{wnid}_{k}.JPEG")
        Image.new("RGB", (64, 64), (9, 80 * label, 0)).save(
            root / "val" / "images" / f"v{label}.JPEG"
        )
        lines.append(f"v{label}.JPEG\t{wnid}\t0\t0\t63\t63\n")
    (root / "val" / "val_annotations.txt").write_text("".join(lines))
    return root / "train" / wnids[1] / "images" / f"{wnids[1]}_1.JPEG"


def truncate_idx(path: Path) -> str:
    path.write_bytes(path.read_bytes()[:-100])
    return "is truncated"


def cifar_wrong_size(path: Path) -> str:
    batch = {b"labels": [0, 1], b"data": np.zeros((2, 3000), np.uint8)}
    path.write_bytes(pickle.dumps(batch, protocol=2))
    return "shape (2, 3000)"


def leaf_num_samples(path: Path) -> str:
    obj = json.loads(path.read_text())
    obj["num_samples"][1] += 5
    path.write_text(json.dumps(obj))
    return "num_samples 8 but 3 samples"


def unreadable_jpeg(path: Path) -> str:
    path.write_bytes(path.read_bytes()[:150])  # a JPEG cut short
    return "cannot be decoded"


CASES = {
    "truncated IDX": ("mnist", write_mnist, truncate_idx),
    "CIFAR wrong array size": ("cifar10", write_cifar10, cifar_wrong_size),
    "LEAF num_samples": ("femnist", write_femnist, leaf_num_samples),
    "unreadable JPEG": ("tiny_imagenet", write_tiny_imagenet, unreadable_jpeg),
}


def write_config(tmp_path: Path, **doc) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**RUN, **doc}), encoding="utf-8")
    return path


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def assert_refused(rc: int, err: str, path: Path, problem: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedbug: error: "), err
    assert str(path) in err, err
    assert problem in err, err


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("case", list(CASES))
def test_corrupt_data_file_is_one_line_exit_2_naming_it_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    dataset, write, corrupt = CASES[case]
    data_dir = tmp_path / "data"
    bad = write(data_dir)
    cfg = write_config(tmp_path, dataset=dataset)
    out = tmp_path / "out"
    # the intact files load and run (so the refusal below is the corruption's)
    assert cli(capsys, "run", cfg, "--data-dir", data_dir, "--out", tmp_path / "ok", "-q")[0] == 0
    problem = corrupt(bad)
    rc, err = cli(capsys, "run", cfg, "--data-dir", data_dir, "--out", out, "-q")
    assert_refused(rc, err, bad, problem)
    assert not out.exists() or not any(out.iterdir())


# -- checkpoints -----------------------------------------------------------------------------


def finished_run(tmp_path: Path, capsys, **doc) -> tuple[Path, Path, Path]:
    """A 2-round digits run with a checkpoint; (config, out, run folder)."""
    cfg = write_config(tmp_path, dataset="digits", rounds=2, checkpoint_every=1, **doc)
    out = tmp_path / "out"
    assert cli(capsys, "run", cfg, "--out", out, "-q")[0] == 0
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return cfg, out, run_dir


def test_flipped_byte_in_checkpoint_is_refused_by_resume(tmp_path: Path, capsys) -> None:
    cfg, out, run_dir = finished_run(tmp_path, capsys)
    ck = run_dir / "checkpoint.pt"
    raw = bytearray(ck.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # one bit of one byte
    ck.write_bytes(bytes(raw))
    before = snapshot(run_dir)
    rc, err = cli(capsys, "run", cfg, "--out", out, "-q", "--resume")
    assert_refused(rc, err, ck, "corrupt (checksum mismatch)")
    assert snapshot(run_dir) == before


def test_checkpoint_from_another_config_is_refused_by_resume(tmp_path: Path, capsys) -> None:
    cfg, out, run_dir = finished_run(tmp_path, capsys)
    other = finished_run(tmp_path / "other", capsys, lr=0.05)[2]
    ck = run_dir / "checkpoint.pt"
    shutil.copyfile(other / "checkpoint.pt", ck)
    before = snapshot(run_dir)
    rc, err = cli(capsys, "run", cfg, "--out", out, "-q", "--resume")
    assert_refused(rc, err, ck, "written by another config")
    assert snapshot(run_dir) == before


def test_checkpoint_from_another_model_is_refused_by_resume(tmp_path: Path, capsys) -> None:
    """The same config hash (a model changed between fedbug versions, or a checkpoint copied
    and relabelled): the weights' size is checked, not left to a torch shape error."""
    cfg, out, run_dir = finished_run(tmp_path, capsys)
    other = finished_run(tmp_path / "other", capsys, model_options={"hidden": [16]})[2]
    state = load_checkpoint_file(other / "checkpoint.pt")
    state["config_hash"] = load_checkpoint_file(run_dir / "checkpoint.pt")["config_hash"]
    RunDir(run_dir).save_checkpoint(state)  # a valid checksum over the foreign weights
    before = snapshot(run_dir)
    rc, err = cli(capsys, "run", cfg, "--out", out, "-q", "--resume")
    assert_refused(rc, err, run_dir / "checkpoint.pt", "written by another model")
    assert "model 'mlp' has" in err
    assert snapshot(run_dir) == before


def stopped_run(tmp_path: Path, **doc):
    cfg = load_config(
        None,
        doc={"name": "ck", "dataset": "digits", **RUN, "rounds": 3, "checkpoint_every": 1, **doc},
    )
    run_dir = tmp_path / "run"
    run_experiment(cfg, run_dir, stop_after=1)
    return cfg, run_dir


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda s: s.pop("server_state"), "lacks server_state"),
        (lambda s: s.update(weights=s["weights"][:-1]), "written by another model"),
        (lambda s: s.update(weights=s["weights"].double()), "float64 weights"),
        (lambda s: s.update(weights=[0.0]), "weights of type list"),
        (lambda s: s.update(round=7), "round 7, outside 0..3"),
        (lambda s: s.update(round="1"), "round '1'"),
        (lambda s: s.update(client_states=[1]), "malformed client states"),
    ],
)
def test_checkpoint_contents_are_checked_against_the_model(tmp_path: Path, change, problem):
    cfg, run_dir = stopped_run(tmp_path)
    rd = RunDir(run_dir)
    state = rd.load_checkpoint()
    change(state)
    rd.save_checkpoint(state)
    before = snapshot(run_dir)
    with pytest.raises(CheckpointError, match=problem) as e:
        run_experiment(cfg, run_dir, resume=True)
    assert str(rd.checkpoint_path) in str(e.value) and "\n" not in str(e.value)
    assert snapshot(run_dir) == before


def test_feddyn_state_of_another_size_is_refused(tmp_path: Path) -> None:
    cfg, run_dir = stopped_run(tmp_path, algorithm="feddyn")
    rd = RunDir(run_dir)
    state = rd.load_checkpoint()
    assert set(state["server_state"]) == {"lambda_sum"} and state["client_states"]
    client = next(iter(state["client_states"]))
    state["client_states"][client]["lambda"] = torch.zeros(3)
    rd.save_checkpoint(state)
    with pytest.raises(CheckpointError, match=f"client {client} state 'lambda' does not fit"):
        run_experiment(cfg, run_dir, resume=True)
    state["client_states"][client]["lambda"] = state["server_state"]["lambda_sum"].clone()
    state["server_state"] = {}
    rd.save_checkpoint(state)
    with pytest.raises(CheckpointError, match="server state does not fit algorithm 'feddyn'"):
        run_experiment(cfg, run_dir, resume=True)
    state = rd.load_checkpoint()
    state["server_state"] = {"lambda_sum": state["weights"].clone()}
    rd.save_checkpoint(state)
    assert run_experiment(cfg, run_dir, resume=True).records[-1]["round"] == 3  # fits: resumes


def test_checkpoint_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    cfg, run_dir = stopped_run(tmp_path)
    RunDir(run_dir).save_checkpoint([1, 2, 3])  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="written by another config"):
        run_experiment(cfg, run_dir, resume=True)


# -- LEAF checks added with these tests ------------------------------------------------------


def test_leaf_user_data_with_an_unlisted_user_is_refused(tmp_path: Path) -> None:
    bad = write_femnist(tmp_path)
    obj = json.loads(bad.read_text())
    obj["user_data"]["f0404"] = obj["user_data"]["f0001"]
    bad.write_text(json.dumps(obj))
    with pytest.raises(DataError, match="'users' does not list: 'f0404'") as e:
        leaf.load_femnist(tmp_path)
    assert str(bad) in str(e.value)


def test_shakespeare_inputs_must_be_80_characters(tmp_path: Path) -> None:
    text = "to be or not to be, that is the question " * 5
    for split, (a, b) in (("train", (0, 20)), ("test", (30, 40))):
        user = {
            "x": [text[i : i + 40] for i in range(a, b)],
            "y": [text[i + 40] for i in range(a, b)],
        }
        obj = {"users": ["P_A"], "num_samples": [b - a], "user_data": {"P_A": user}}
        (tmp_path / split).mkdir()
        (tmp_path / split / "s.json").write_text(json.dumps(obj))
    with pytest.raises(DataError, match="inputs \\(x\\) of 40 characters where LEAF's Shakespeare"):
        leaf.load_shakespeare(tmp_path)
