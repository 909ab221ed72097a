"""Nothing fedbug writes in a run folder goes through a symbolic link (RELIABILITY.md, "Trust
model"): a received run folder could hold links pointing anywhere. The drill: ``.lock`` as a
link, and ``run --resume`` (even a ``repair`` that found nothing to repair) wrote the pid and
token into the file it points at, outside the run folder."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from tiny import tiny_config

import fedbug
from fedbug.cli import main
from fedbug.errors import LinkRefused
from fedbug.results import RunDir, atomic_write_bytes


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("links")
    fedbug.run(tiny_config(rounds=2, checkpoint_every=1, count_flops=False), run_dir=root / "run")
    return root / "run"


@pytest.fixture
def run(finished, tmp_path) -> Path:
    shutil.copytree(finished, tmp_path / "run", symlinks=True)
    return tmp_path / "run"


@pytest.fixture
def outside(tmp_path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    return victim


def _config(run: Path, tmp_path: Path) -> Path:
    cfg = tmp_path / "c.yaml"
    cfg.write_text((run / "config.yaml").read_text())
    return cfg


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in run.rglob("*") if p.is_file() and not p.is_symlink()}


def _cfg(run: Path):
    from fedbug.config import load_config

    return load_config(run / "config.yaml")


@pytest.mark.parametrize("command", ["repair", "resume"])
def test_a_linked_lock_is_never_written_through(run, outside, capsys, command):
    (run / ".lock").symlink_to(outside)
    before = _snapshot(run)
    if command == "repair":  # a whole run: nothing to repair, yet it took the lock
        assert main(["repair", str(run), "-q"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and ".lock' is a symbolic link" in err
    else:
        with pytest.raises(LinkRefused, match=".lock' is a symbolic link"):
            fedbug.run(_cfg(run), run, resume=True)
    assert outside.read_text() == "precious\n"
    assert _snapshot(run) == before


def test_a_link_anywhere_in_a_resumed_run_folder_is_refused(run, tmp_path, capsys):
    """A resumed run rewrites client states, Flower's files and more below its folder: a link
    there is refused before anything is written."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (run / "client_states").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(LinkRefused, match="client_states' is a symbolic link"):
        fedbug.run(_cfg(run), run, resume=True)
    assert list(elsewhere.iterdir()) == []


def test_a_twenty_digit_pid_in_lock_is_not_a_traceback(run):
    (run / ".lock").write_text("12345678901234567890\nabc\n")
    rd = RunDir(run)
    rd.acquire_lock()  # no one locks it and the number is no pid: the lock is free
    try:
        assert (run / ".lock").read_text().startswith(f"{os.getpid()}\n")
    finally:
        rd.release_lock()


def test_an_atomic_write_never_follows_a_planted_temporary_file(tmp_path, outside):
    target = tmp_path / "summary.json"
    (tmp_path / f".summary.json.tmp-{os.getpid()}").symlink_to(outside)
    atomic_write_bytes(target, b"{}\n")
    assert target.read_bytes() == b"{}\n" and outside.read_text() == "precious\n"


def test_an_atomic_write_replaces_a_link_instead_of_writing_where_it_points(tmp_path, outside):
    target = tmp_path / "summary.json"
    target.symlink_to(outside)
    atomic_write_bytes(target, b"{}\n")
    assert not target.is_symlink() and outside.read_text() == "precious\n"


def test_metrics_are_not_appended_through_a_link_or_to_a_fifo(tmp_path, outside):
    rd = RunDir(tmp_path / "r")
    rd.create()
    rd.metrics_path.symlink_to(outside)
    with pytest.raises(LinkRefused, match="symbolic link"):
        rd.append_metrics({"round": 1})
    rd.metrics_path.unlink()
    os.mkfifo(rd.metrics_path)  # would block an append forever
    with pytest.raises(LinkRefused, match="not a regular file"):
        rd.append_metrics({"round": 1})
    assert outside.read_text() == "precious\n"


def test_a_sweep_cell_that_is_a_link_is_refused(tmp_path, capsys):
    cfg = tmp_path / "s.yaml"
    cfg.write_text("name: lk\ndataset: digits\nmodel: mlp\nrounds: 1\nnum_clients: 10\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    sweep = tmp_path / "out" / "lk-sweep"
    sweep.mkdir(parents=True)
    (sweep / "base-s0").symlink_to(elsewhere, target_is_directory=True)
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "out"), "-q"]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


def test_an_attacks_log_planted_as_a_link_is_never_written_through(tmp_path, outside, capsys):
    """A received run folder with ``attack/<name>/attack.log`` linked to a file elsewhere:
    ``fedbug attack`` refuses in one line before it writes a byte there."""
    cfg = tiny_config(rounds=2, count_flops=False, record_updates=[1], clients_per_round=1)
    folder = fedbug.run(cfg, run_dir=tmp_path / "run").run_dir
    client = sorted(p.stem for p in (folder / "updates" / "round-1").glob("client-*.json"))[0]
    log = folder / "attack" / f"round-1-{client}-ig-unrolled" / "attack.log"
    log.parent.mkdir(parents=True)
    log.symlink_to(outside)
    assert main(["attack", str(folder), "--iterations", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "symbolic link" in err[0] and "attack.log" in err[0]
    assert outside.read_text() == "precious\n"
