"""A process that writes a run folder for the lock's holder (Flower's ServerApp for `fedbug run`)
joins the lock with the holder's token and stops at its next write once the holder is gone or
another run holds the folder."""

from __future__ import annotations

import os
import signal

import pytest

from fedbug.errors import RunFolderBusy
from fedbug.results import RunDir


def test_joined_writer_writes_while_the_holder_holds(tmp_path):
    holder, writer = RunDir(tmp_path), RunDir(tmp_path)
    holder.acquire_lock()
    writer.join_lock(holder.lock_token)
    writer.append_metrics({"round": 1})
    assert writer.read_metrics() == [{"round": 1}]
    writer.release_lock()
    assert holder.lock_path.exists()  # the holder's to remove
    holder.release_lock()


def test_wrong_token_is_refused(tmp_path):
    holder = RunDir(tmp_path)
    holder.acquire_lock()
    with pytest.raises(RunFolderBusy, match="no longer holds it"):
        RunDir(tmp_path).join_lock("not-the-token")
    holder.release_lock()


def test_writer_stops_once_the_holder_ended_and_another_run_took_the_folder(tmp_path):
    holder, writer = RunDir(tmp_path), RunDir(tmp_path)
    holder.acquire_lock()
    writer.join_lock(holder.lock_token)
    holder.release_lock()
    with pytest.raises(RunFolderBusy, match="--resume"):
        writer.append_metrics({"round": 1})
    other = RunDir(tmp_path)
    other.acquire_lock()  # a new run's token in .lock
    with pytest.raises(RunFolderBusy):
        writer.save_checkpoint({"round": 1})
    assert not (tmp_path / "metrics.jsonl").exists()
    assert not (tmp_path / "checkpoint.pt").exists()
    other.release_lock()


def test_writer_stops_once_the_holder_is_killed(tmp_path):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the holder: takes the lock, says its token, waits to be killed
        rd = RunDir(tmp_path)
        rd.acquire_lock()
        os.write(write, rd.lock_token.encode())
        signal.pause()
        os._exit(0)
    token = os.read(read, 64).decode()
    writer = RunDir(tmp_path)
    writer.join_lock(token)
    writer.append_metrics({"round": 1})
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    with pytest.raises(RunFolderBusy):
        writer.append_metrics({"round": 2})
    assert len(writer.read_metrics()) == 1
