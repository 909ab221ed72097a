"""Flower's deployment runtime on loopback: a SuperLink and SuperNodes this test starts, the
run submitted by ``fedbug run -s executor=flower-deployment``; equal to in-process, and a
SuperNode killed mid-run is recorded as a dropped client."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flowergrid import Deployment, only_run, run_records  # noqa: E402
from tlscerts import make_certificates, make_node_key  # noqa: E402

from fedbug.cli import main  # noqa: E402
from fedbug.integrations.flower.launch import CONNECTION, flower_env, write_connection  # noqa: E402

SMOKE = Path(__file__).resolve().parents[2] / "configs" / "flower-smoke.yaml"


def register(public: Path, home: Path) -> None:
    """``flwr supernode register``, retried while the SuperLink's APIs come up."""
    end = time.monotonic() + 120
    while True:
        done = subprocess.run(
            ["flwr", "supernode", "register", str(public), CONNECTION],
            env=flower_env(home),
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode == 0:
            return
        assert time.monotonic() < end, done.stdout + done.stderr
        time.sleep(1.0)


@pytest.fixture
def deployment(tmp_path):
    d = Deployment(tmp_path / "flower")
    yield d
    assert d.stop() == [], "a Flower process outlived the test"


@pytest.mark.slow
def test_loopback_tls_deployment_equals_in_process(tmp_path, deployment):
    """TLS and SuperNode authentication: two registered SuperNodes (served by warm workers: a
    ClientApp process a message costs ~15 s here, and the killed-node test below keeps
    Flower's default isolation) run two rounds equal to in-process; a SuperNode with an
    unregistered key is refused (Flower's exit code 305)."""
    certs = make_certificates(tmp_path / "certs")
    deployment.start_superlink(
        "--ssl-ca-certfile",
        str(certs["ca"]),
        "--ssl-certfile",
        str(certs["cert"]),
        "--ssl-keyfile",
        str(certs["key"]),
        "--enable-supernode-auth",
    )
    home = tmp_path / "cli"
    write_connection(home, deployment.address, str(certs["ca"]))
    keys = [make_node_key(tmp_path / "certs", f"node{i}") for i in range(3)]
    for _private, public in keys[:2]:
        register(public, home)
    tls = ("--root-certificates", str(certs["ca"]))
    for i in range(2):
        deployment.start_supernode(
            i, 2, *tls, "--auth-supernode-private-key", str(keys[i][0]), warm=True
        )
    stranger = deployment.start_supernode(
        2, 2, *tls, "--auth-supernode-private-key", str(keys[2][0])
    )
    deployment.wait_for_nodes(2)
    # Flower 1.41 logs exit code 305 ("Failed to activate SuperNode") and the process ends 1
    assert stranger.wait(timeout=120) != 0
    assert "ref-exit-codes/305" in deployment.log("node2")
    flags = ["-s", "num_clients=2", "-s", "clients_per_round=2", "-s", "rounds=2"]
    assert main(["run", str(SMOKE), *flags, "--out", str(tmp_path / "here"), "-q"]) == 0
    remote = [
        "-s",
        "executor=flower-deployment",
        "-s",
        f"flower.superlink={deployment.address}",
        "-s",
        f"flower.root_certificates={certs['ca']}",
    ]
    assert main(["run", str(SMOKE), *flags, *remote, "--out", str(tmp_path / "there"), "-q"]) == 0
    here, there = only_run(tmp_path / "here"), only_run(tmp_path / "there")
    assert run_records(there) == run_records(here)
    a = json.loads((here / "summary.json").read_text())
    b = json.loads((there / "summary.json").read_text())
    assert a["weights_sha256"] == b["weights_sha256"]


@pytest.mark.slow
def test_a_killed_supernode_is_dropped_and_the_run_completes(tmp_path, deployment):
    deployment.start_superlink()
    for i in range(3):
        deployment.start_supernode(i, 3)
    deployment.wait_for_nodes(3)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "fedbug.cli", "run", str(SMOKE), "-q", "--out", str(out)]
    for s in (
        "num_clients=3",
        "clients_per_round=3",
        "rounds=2",
        "executor=flower-deployment",
        f"flower.superlink={deployment.address}",
        "flower.round_timeout=45",
    ):
        cmd += ["-s", s]
    run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 240
        while time.monotonic() < end:
            metrics = list(out.glob("*/metrics.jsonl"))
            if metrics and metrics[0].read_text().count("\n") >= 1:
                break
            assert run.poll() is None, run.communicate()
            time.sleep(0.5)
        deployment.kill("node2", signal.SIGKILL)
        stdout, stderr = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, stderr
    first, second = run_records(only_run(out))
    # round 1: every client answers unless the machine is too slow for the round timeout
    assert 2 in first["clients"]
    # round 2: node 2 is gone; its client is dropped with a reason, the others aggregated
    assert 2 not in second["clients"] and second["clients"], second
    assert [d["client"] for d in second["dropped"]] == [2]
    assert second.get("aggregated", True)


@pytest.mark.slow
def test_warm_workers_serve_each_node_from_one_process(tmp_path, deployment):
    """SuperNodes in ``--isolation process``, each served by one ``fedbug flower worker``: the
    smoke config (FedDyn: each client's state lives in its node's context, which the worker
    pushes back after every message) gives the in-process numbers over 3 rounds, and each
    worker ran all its node's messages (the query, then a TRAIN a round) in its one process."""
    deployment.start_superlink()
    for i in range(2):
        deployment.start_supernode(i, 2, warm=True)
    deployment.wait_for_nodes(2)
    flags = ["-s", "num_clients=2", "-s", "clients_per_round=2", "-s", "rounds=3"]
    assert main(["run", str(SMOKE), *flags, "--out", str(tmp_path / "here"), "-q"]) == 0
    remote = ["-s", "executor=flower-deployment", "-s", f"flower.superlink={deployment.address}"]
    assert main(["run", str(SMOKE), *flags, *remote, "--out", str(tmp_path / "there"), "-q"]) == 0
    here, there = only_run(tmp_path / "here"), only_run(tmp_path / "there")
    records = run_records(there)
    assert records == run_records(here)
    assert not any(r.get("state_reset") for r in records)
    a = json.loads((here / "summary.json").read_text())
    b = json.loads((there / "summary.json").read_text())
    assert a["weights_sha256"] == b["weights_sha256"]
    for i in range(2):
        _procs, _home, worker = deployment.parts[f"worker{i}"]
        assert worker.poll() is None, deployment.log(f"worker{i}")  # the same process throughout
        log = deployment.log(f"worker{i}")
        assert log.count("fedbug worker: task") == 4, log
        assert log.count("completed") == 4, log
