"""A malicious checkpoint with a valid header and checksum (its payload pickles a call to
``os.system``) is refused unread with one line of ours naming the file and the way out, never
torch's six lines with their advice to load with ``weights_only=False``."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from pathlib import Path

import pytest
import torch

from fedbug.cli import main
from fedbug.errors import CheckpointError
from fedbug.results import CHECKPOINT_MAGIC, load_checkpoint_file

CONFIG = """\
name: ck
dataset: digits
model: mlp
num_clients: 2
clients_per_round: 2
rounds: 2
local_steps: 1
batch_size: 4
eval_batch_size: 64
count_flops: false
threads: 1
partition: iid
checkpoint_every: 1
"""


class Payload:
    """Unpickling it would run a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def malicious(marker: Path, kind: str) -> bytes:
    """A checkpoint whose header and SHA-256 are valid and whose payload is hostile: torch's zip
    format (torch.save) or a bare pickle (protocol 4, for which torch also warns)."""
    if kind == "torch.save":
        buf = io.BytesIO()
        torch.save({"round": 1, "weights": Payload(marker)}, buf)
        payload = buf.getvalue()
    else:
        payload = pickle.dumps({"round": 1, "weights": Payload(marker)}, protocol=4)
    digest = hashlib.sha256(payload).hexdigest().encode()
    return CHECKPOINT_MAGIC + digest + b"\n" + payload


def assert_ours(message: str, path: Path) -> None:
    assert len(message.splitlines()) == 1, message
    assert str(path) in message, message
    assert "weights_only" not in message and "Traceback" not in message, message
    assert "delete it" in message, message


@pytest.mark.parametrize("kind", ["torch.save", "pickle"])
def test_load_refuses_a_hostile_payload_with_one_line(tmp_path, kind):
    marker = tmp_path / "ran"
    ck = tmp_path / "checkpoint.pt"
    ck.write_bytes(malicious(marker, kind))
    with pytest.raises(CheckpointError) as err:
        load_checkpoint_file(ck)
    assert_ours(str(err.value), ck)
    assert not marker.exists()  # nothing in it ran


def test_resume_refuses_a_hostile_checkpoint_with_one_line(tmp_path, capsys):
    cfg = tmp_path / "ck.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "-q"]) == 0
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    marker = tmp_path / "ran"
    ck = run_dir / "checkpoint.pt"
    ck.write_bytes(malicious(marker, "torch.save"))
    before = {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())}
    capsys.readouterr()
    assert main(["run", str(cfg), "--out", str(out), "-q", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedbug: error: ")
    assert_ours(err, ck)
    assert not marker.exists()
    assert {p.name: p.read_bytes() for p in sorted(run_dir.iterdir())} == before
