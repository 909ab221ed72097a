"""A full disk (ENOSPC) while writing a checkpoint, the metrics or a plot: one line on stderr
naming the file, exit 2, the last good checkpoint intact and resumable, no temporary file left.

The fault is injected by replacing ``fedbug.results.files.open_write`` (where every run-folder
write goes through): the chosen file's n-th opening for writing gets half its bytes and then
``OSError(ENOSPC)`` with no file name, as a real ``write`` raises it.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from tiny import without_timing

import fedbug.results
import fedbug.results.files
from fedbug.cli import main
from fedbug.results import load_checkpoint_file

CONFIG = """\
name: full
dataset: digits
model: mlp
num_clients: 6
clients_per_round: 2
rounds: 4
local_steps: 1
batch_size: 16
eval_batch_size: 512
checkpoint_every: 2
"""


class _FullDisk:
    """A file whose first write stores half its bytes, then fails as a full disk does."""

    def __init__(self, f) -> None:  # noqa: ANN001
        self._f = f

    def write(self, data):  # noqa: ANN001, ANN201
        self._f.write(data[: len(data) // 2])
        self._f.flush()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __getattr__(self, name: str):  # noqa: ANN204
        return getattr(self._f, name)

    def __enter__(self):  # noqa: ANN204
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002
        self._f.close()


def _inject(monkeypatch: pytest.MonkeyPatch, name: str, nth: int) -> None:
    """Fail the ``nth`` opening for writing of a file called ``name`` (or its temporary)."""
    count = 0

    real = fedbug.results.files.open_write

    def faulty_open(file, append=False):  # noqa: ANN001, ANN202
        nonlocal count
        f = real(file, append)
        base = Path(file).name
        if base == name or base.startswith(f".{name}.tmp-"):
            count += 1
            if count == nth:
                return _FullDisk(f)
        return f

    monkeypatch.setattr(fedbug.results.files, "open_write", faulty_open)


def _run(capsys, cfg: Path, out: Path, *extra: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["run", str(cfg), "--out", str(out), "-q", *extra])
    return rc, capsys.readouterr().err


def _final(run_dir: Path) -> tuple[list[dict], torch.Tensor]:
    text = (run_dir / "metrics.jsonl").read_text(encoding="utf-8")
    assert text.endswith("\n")
    records = without_timing(json.loads(x) for x in text.splitlines())
    return records, load_checkpoint_file(run_dir / "checkpoint.pt")["weights"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    cfg = tmp / "full.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    assert main(["run", str(cfg), "--out", str(tmp / "out"), "-q"]) == 0
    (run_dir,) = (tmp / "out").iterdir()
    return _final(run_dir)


@pytest.mark.parametrize(
    "name, nth, last_good",
    [
        ("checkpoint.pt", 2, 2),  # the round-4 checkpoint; round 2's stays
        ("metrics.jsonl", 4, 2),  # round 3's line, torn in half (1st: the emptied file)
        ("accuracy.png", 1, 4),  # the plot after the last round
    ],
)
def test_disk_full_is_one_line_and_the_last_checkpoint_resumes(
    tmp_path, capsys, monkeypatch, uninterrupted, name, nth, last_good
):
    cfg = tmp_path / "full.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        _inject(m, name, nth)
        rc, err = _run(capsys, cfg, out)
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert name in lines[0] and "No space left on device" in lines[0], err
    (run_dir,) = out.iterdir()
    assert not [p.name for p in run_dir.iterdir() if ".tmp" in p.name or p.name == ".lock"]
    assert load_checkpoint_file(run_dir / "checkpoint.pt")["round"] == last_good

    rc, err = _run(capsys, cfg, out, "--resume")
    assert rc == 0, err
    records, weights = _final(run_dir)
    want_records, want_weights = uninterrupted
    assert records == want_records
    assert torch.equal(weights, want_weights)
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "completed"
    assert (run_dir / "accuracy.png").read_bytes().startswith(b"\x89PNG")


def test_atomic_write_removes_its_temporary_file_and_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "x.json"
    target.write_text("old", encoding="utf-8")
    _inject(monkeypatch, "x.json", 1)
    with pytest.raises(OSError) as e:
        fedbug.results.atomic_write_text(target, "new" * 1000)
    assert e.value.errno == errno.ENOSPC
    assert e.value.filename == str(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]
    assert target.read_text(encoding="utf-8") == "old"
