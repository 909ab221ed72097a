"""Random damage of a run's ``checkpoint.pt`` under ``fedbug run --resume`` and ``fedbug repair``.

A finished and a stopped 3-round run (a checkpoint every round) are made once; each example
copies one, damages its checkpoint and resumes it in-process through the CLI: 1-3 bytes changed
anywhere, a cut, bytes appended, a zero-filled hole, any of those with the header's SHA-256
recomputed over the damaged payload (the checksum then passes: torch's zip records or the
tensors in them are what is damaged), or a valid checkpoint of the same run at another round
swapped in. The resume either ends exactly as the uninterrupted run did, or is refused: exit 2,
one stderr line naming the file and pointing to ``fedbug repair``, no traceback, the folder
byte for byte as it was; never a hang (each example under SIGALRM). ``fedbug repair`` rebuilds a
few damaged checkpoints equal to the original.

``FEDBUG_FUZZ_EXAMPLES=N`` runs N random examples instead of the fixed 100 (``derandomize``) of
the default suite; ``-s`` prints the tally."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import struct
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from guards import at_most
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tiny import without_timing

import fedbug
from fedbug.cli import main
from fedbug.cli.run import run_dir_for
from fedbug.config import load_config
from fedbug.results import CHECKPOINT_MAGIC, RunDir, load_checkpoint_file

EXAMPLES = int(os.environ.get("FEDBUG_FUZZ_EXAMPLES", "0"))
TALLY: dict[str, int] = {"resumed": 0, "refused": 0}
FOUND: dict[str, int] = {}

CONFIG = """\
name: ck
dataset: digits
model: mlp
num_clients: 4
clients_per_round: 2
rounds: 3
local_steps: 1
batch_size: 8
eval_batch_size: 512
count_flops: false
threads: 1
partition: iid
checkpoint_every: 1
"""


@pytest.fixture(scope="module", autouse=True)
def _no_plots() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for name in ("plot_run", "plot_partition"):
            mp.setattr(f"fedbug.engine.run_folder.{name}", lambda *a, **k: None)
        yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """The run made once: its config file, the stopped (after round 2) and finished folders, the
    checkpoint of each round, and what the uninterrupted run ends with."""
    root = tmp_path_factory.mktemp("ck")
    (root / "ck.yaml").write_text(CONFIG, encoding="utf-8")
    cfg = load_config(str(root / "ck.yaml"))
    run_dir = run_dir_for(cfg, root / "out")
    checkpoints = {}
    for r in (1, 2, 3):
        fedbug.run(cfg, run_dir, resume=r > 1, stop_after=r if r < 3 else None)
        checkpoints[r] = (run_dir / "checkpoint.pt").read_bytes()
        if r == 2:
            shutil.copytree(run_dir, root / "stopped")
    return {
        "config": root / "ck.yaml",
        "name": run_dir.name,
        "finished": run_dir,
        "stopped": root / "stopped",
        "checkpoints": checkpoints,
        "end": ended(run_dir),
    }


def ended(run_dir: Path) -> tuple[list[dict[str, Any]], int, torch.Tensor]:
    """(metrics.jsonl less its timings, the checkpoint's round, its weights)."""
    rd = RunDir(run_dir)
    ck = load_checkpoint_file(rd.checkpoint_path)
    return without_timing(rd.read_metrics()), ck["round"], ck["weights"]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def rehashed(payload: bytes) -> bytes:
    return CHECKPOINT_MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def damaged(raw: bytes, how: tuple, runs: dict[str, Any]) -> bytes:
    """``raw`` (a whole checkpoint file) with the damage ``how`` done to it."""
    kind = how[0]
    if kind == "swap":
        return runs["checkpoints"][how[1]]
    if kind == "rehash":  # the damage inside the payload, the header's SHA-256 made to fit it
        head, _, payload = raw.partition(b"\n")
        return rehashed(damaged(payload, how[1], runs))
    data = bytearray(raw)
    if kind == "flip":
        for where, value in how[1]:
            at = int(where * len(data))
            data[at] = value if value != data[at] else (value + 1) % 256
    elif kind == "cut":
        del data[int(how[1] * len(data)) :]
    elif kind == "append":
        data += how[1]
    elif kind == "hole":
        at = int(how[1] * len(data))
        data[at : at + how[2]] = bytes(len(data[at : at + how[2]]))
    return bytes(data)


where = st.floats(0, 1, exclude_max=True)
plain = st.one_of(
    st.tuples(
        st.just("flip"),
        st.lists(st.tuples(where, st.integers(0, 255)), min_size=1, max_size=3),
    ),
    st.tuples(st.just("cut"), where),
    st.tuples(st.just("append"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("hole"), where, st.integers(1, 512)),
)
damage = st.tuples(
    st.sampled_from(["finished", "stopped"]),
    st.one_of(  # the branches drawn alike: 4 of 9 with the SHA-256 made to fit the damage
        plain,
        *[st.tuples(st.just("rehash"), plain) for _ in range(4)],
        st.tuples(st.just("swap"), st.sampled_from([1, 2, 3])),
    ),
)


def copy_run(runs: dict[str, Any], which: str, base: Path) -> tuple[Path, Path]:
    """A copy of the ``which`` run under a fresh ``--out``: (that out, the run folder)."""
    out = base / f"o{time.perf_counter_ns()}"
    shutil.copytree(runs[which], out / runs["name"])
    return out, out / runs["name"]


def resume(config: Path, out: Path) -> tuple[int, str]:
    """``fedbug run CONFIG --out OUT --resume -q`` in this process: (exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), at_most(30):
        rc = main(["run", str(config), "--out", str(out), "--resume", "-q"])
    return rc, err.getvalue()


def check_outcome(runs: dict[str, Any], run_dir: Path, rc: int, err: str, before: dict) -> str:
    """The property: resumed to the uninterrupted run's end, or refused in one line."""
    if rc == 0:
        records, round_, weights = ended(run_dir)
        want_records, want_round, want_weights = runs["end"]
        assert records == want_records and round_ == want_round
        assert torch.equal(weights, want_weights)
        return "resumed"
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert str(run_dir / "checkpoint.pt") in err or str(run_dir / "metrics.jsonl") in err, err
    assert "fedbug repair" in err, err
    assert snapshot(run_dir) == before
    return "refused"


@settings(
    max_examples=EXAMPLES or 100,
    derandomize=not EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(damage)
@example(("finished", ("swap", 1)))  # rounds 2-3 run again: the same end
@example(("stopped", ("swap", 3)))  # a checkpoint past metrics.jsonl's rounds
def test_random_checkpoint_damage_resumes_exactly_or_is_refused(runs, tmp_path, damage):
    which, how = damage
    out, run_dir = copy_run(runs, which, tmp_path)
    ck = run_dir / "checkpoint.pt"
    ck.write_bytes(damaged(ck.read_bytes(), how, runs))
    before = snapshot(run_dir)
    rc, err = resume(runs["config"], out)
    outcome = check_outcome(runs, run_dir, rc, err, before)
    TALLY[outcome] += 1
    key = f"{which} {how[0]}{'-' + how[1][0] if how[0] == 'rehash' else ''} {outcome}"
    FOUND[key] = FOUND.get(key, 0) + 1
    shutil.rmtree(out)


def test_random_checkpoint_damage_tally():
    """Run after the random test: what the examples did (printed with -s)."""
    print(f"\ncheckpoint damage drill: {TALLY}")
    for key, n in sorted(FOUND.items()):
        print(f"  {key}: {n}")


# -- what the random run found, fixed cases ---------------------------------------------------


def _record_offset(payload: bytes, name: str) -> int:
    """Where the data of the zip record ``name`` (as ``archive/NAME``) starts in ``payload``."""
    info = zipfile.ZipFile(io.BytesIO(payload)).getinfo(f"archive/{name}")
    at = info.header_offset
    name_len, extra_len = struct.unpack("<HH", payload[at + 26 : at + 30])
    return at + 30 + name_len + extra_len


def _in_record(name: str, skip: int) -> Any:
    def change(payload: bytes) -> bytes:
        data = bytearray(payload)
        data[_record_offset(payload, name) + skip] ^= 0x10
        return bytes(data)

    return change


FOUND_CASES = {
    # a byte of the header: "(bad header)", no way out named
    "header byte": (lambda raw: b"X" + raw[1:], None, "bad header"),
    # a weight's byte, SHA-256 recomputed: resumed from other weights, in silence
    "weight byte": (None, _in_record("data/0", 4 * 100 + 2), "CRC-32"),
    # a byte of the pickle (data.pkl), SHA-256 recomputed: "holds objects other than tensors",
    # "delete it and run the config again with another --out" (damage taken for an attack)
    "pickle byte": (None, _in_record("data.pkl", 40), "CRC-32"),
    # the payload cut in half, SHA-256 recomputed: "cannot be loaded (negative seek value ...);
    # delete it and run the config again with another --out"
    "payload cut": (None, lambda p: p[: len(p) // 2], "its zip payload is damaged"),
    # the payload's first byte: torch read the zip as a bare pickle, "holds objects other
    # than tensors"
    "zip magic": (None, lambda p: b"Q" + p[1:], "not torch's zip format"),
}


@pytest.mark.parametrize("case", list(FOUND_CASES))
def test_damage_the_random_run_found_is_refused_pointing_to_repair(runs, tmp_path, case):
    whole, inner, problem = FOUND_CASES[case]
    out, run_dir = copy_run(runs, "stopped", tmp_path)
    ck = run_dir / "checkpoint.pt"
    raw = ck.read_bytes()
    if whole is not None:
        ck.write_bytes(whole(raw))
    else:
        ck.write_bytes(rehashed(inner(raw.partition(b"\n")[2])))
    before = snapshot(run_dir)
    rc, err = resume(runs["config"], out)
    assert check_outcome(runs, run_dir, rc, err, before) == "refused"
    assert problem in err and f"`fedbug repair {str(run_dir)!r}`" in err, err
    assert "other than tensors" not in err


# -- repair -----------------------------------------------------------------------------------

REPAIRED = {
    "finished, a weight byte (SHA-256 recomputed)": (
        "finished",
        ("rehash", ("flip", [(0.75, 7)])),
    ),
    "finished, cut": ("finished", ("cut", 0.5)),
    "finished, round 1's checkpoint": ("finished", ("swap", 1)),
    "stopped, a zero-filled hole (SHA-256 recomputed)": (
        "stopped",
        ("rehash", ("hole", 0.3, 64)),
    ),
}


@pytest.mark.parametrize("case", list(REPAIRED))
def test_repair_rebuilds_a_damaged_checkpoint_equal_to_the_original(runs, tmp_path, case):
    which, how = REPAIRED[case]
    _, run_dir = copy_run(runs, which, tmp_path)
    ck = run_dir / "checkpoint.pt"
    want = ended(run_dir)
    ck.write_bytes(damaged(ck.read_bytes(), how, runs))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()), at_most(60):
        assert main(["repair", str(run_dir), "-q"]) == 0
    assert "damaged: checkpoint.pt" in out.getvalue(), out.getvalue()
    records, round_, weights = ended(run_dir)
    assert records == want[0] and round_ == want[1] and torch.equal(weights, want[2])


def test_a_checkpoint_keeps_its_crcs_where_the_process_turned_them_off(tmp_path):
    """torch's ``compute_crc32 = False`` (a setting of the whole process) wrote CRCs of 0, which
    the load now checks: every checkpoint of such a process would be refused as damaged. (Set
    through torch's own patch(): monkeypatch's undo deleted the key from torch's config, and
    every later torch.save of the suite failed.)"""
    config = pytest.importorskip("torch.utils.serialization").config
    path = tmp_path / "checkpoint.pt"
    with config.patch({"save.compute_crc32": False}):
        RunDir(tmp_path).save_checkpoint({"round": 1, "weights": torch.arange(4.0)})
        assert config.save.compute_crc32 is False  # the process's setting, as it was
    assert torch.equal(load_checkpoint_file(path)["weights"], torch.arange(4.0))
    torch.save(torch.zeros(1), tmp_path / "after.pt")  # torch's setting whole after the test
