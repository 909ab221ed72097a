"""The simulation launcher's helpers: Ray's session folder (removed on the way out; one that a
SIGKILLed launcher left behind is removed by the next launcher), and the CPUs a client gets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("flwr")

from tiny import tiny_config  # noqa: E402

from fedbug.integrations.flower.launch import RAY_TMP_OWNER, _ray_tmp, client_cpus  # noqa: E402


def test_an_orphaned_ray_folder_is_removed_by_the_next_launcher(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = tmp_path / "fbrayorphan"  # its launcher was killed: the pid is gone
    (orphan / "ray").mkdir(parents=True)
    (orphan / RAY_TMP_OWNER).write_text(f"{gone.pid}\n")
    running = tmp_path / "fbrayrunning"  # another launcher, still running
    running.mkdir()
    (running / RAY_TMP_OWNER).write_text(f"{os.getpid()}\n")
    foreign = tmp_path / "fbrayforeign"  # no owner file: not ours to remove
    foreign.mkdir()
    with _ray_tmp(tmp_path) as mine:
        assert (mine / RAY_TMP_OWNER).read_text() == f"{os.getpid()}\n"
        assert not orphan.exists()
        assert running.exists() and foreign.exists()
    assert not mine.exists()


def test_fewer_cpus_than_threads_a_client_is_warned():
    two = tiny_config(threads=2)
    assert client_cpus(two) == 2.0
    one_cpu = two.model_copy(update={"flower": two.flower.model_copy(update={"num_cpus": 1})})
    with pytest.warns(UserWarning, match=r"flower.num_cpus=1 is below threads=2"):
        assert client_cpus(one_cpu) == 1.0
