"""A Flower deployment on this machine's loopback: a SuperLink and SuperNodes, each with its own
``FLWR_HOME``, for the tests and ``benchmarks/flower/flower_deployment.py``.

    d = Deployment(tmp)
    d.start_superlink()
    for i in range(2):
        d.start_supernode(i, 2, warm=True)  # served by a `fedbug flower worker`
    d.wait_for_nodes(2)
    ...  # fedbug run -s executor=flower-deployment -s flower.superlink=<d.address>
    d.stop()
"""

from __future__ import annotations

import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from subprocess import Popen
from typing import Any

from fedbug.integrations.flower.launch import Processes, flower_env, free_port, processes_with_env


class Deployment:
    """A SuperLink and SuperNodes on loopback under ``root`` (a folder each, with its log);
    :meth:`stop` ends every process they started (by group, then by ``FLWR_HOME``)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.parts: dict[str, tuple[Processes, Path, Popen[Any]]] = {}

    def _start(self, name: str, cmd: list[str], home: Path | None = None) -> Popen[Any]:
        home = home or self.root / name
        home.mkdir(parents=True, exist_ok=True)
        procs = Processes(home)
        proc = procs.start(cmd, flower_env(home), home / f"{name}.log")
        self.parts[name] = (procs, home, proc)
        return proc

    def log(self, name: str) -> str:
        """What the part ``name`` (superlink, node0, worker0, ...) wrote so far."""
        _procs, home, _proc = self.parts[name]
        return (home / f"{name}.log").read_text(errors="replace")

    def start_superlink(self, *extra: str, timeout: float = 60.0) -> Popen[Any]:
        """``extra``: the SuperLink's TLS and authentication flags (default ``--insecure``)."""
        proc = self._start(
            "superlink",
            [
                "flower-superlink",
                *(extra or ("--insecure",)),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
            ],
        )
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return proc
            time.sleep(0.3)
        raise TimeoutError(f"the SuperLink did not listen on {self.address} within {timeout} s")

    def start_supernode(
        self, i: int, n: int, *extra: str, node_config: str = "", warm: bool = False
    ) -> Popen[Any]:
        """SuperNode ``node{i}`` holding partition ``i`` of ``n``; ``extra``: its TLS flags
        (default ``--insecure``); ``warm``: in ``--isolation process``, served by a
        ``fedbug flower worker`` (``worker{i}``, insecure) in the node's folder."""
        runtime = free_port()
        proc = self._start(
            f"node{i}",
            [
                "flower-supernode",
                *(extra or ("--insecure",)),
                "--superlink",
                self.address,
                "--node-config",
                f"partition-id={i} num-partitions={n} {node_config}".strip(),
                "--port",
                str(runtime),
                *(("--isolation", "process") if warm else ()),
            ],
        )
        if warm:
            self._start(
                f"worker{i}",
                [sys.executable, "-m", "fedbug.cli", "flower", "worker"]
                + ["--runtime-api", f"127.0.0.1:{runtime}", "--insecure"],
                home=self.parts[f"node{i}"][1],  # the node's FLWR_HOME: its installed apps
            )
        return proc

    def wait_for_nodes(self, n: int, timeout: float = 120.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.log("superlink").count("Activated node_id") >= n:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{n} SuperNodes did not connect within {timeout} s")

    def kill(self, name: str, sig: int) -> None:
        os.killpg(self.parts[name][2].pid, sig)

    def stop(self) -> list[int]:
        """Stop everything; the pids still alive afterwards (should be none). The parts stop
        side by side: each Flower process takes a second or more to shut down on SIGTERM, and
        one part after another that was several seconds of waiting for every deployment."""
        # a node and its worker share a FLWR_HOME (each stop ends what carries its home): they
        # stop in turn, the node first, as before
        by_home: dict[Path, list[Processes]] = {}
        for procs, home, _proc in self.parts.values():
            by_home.setdefault(home, []).append(procs)

        def stop_in_turn(group: list[Processes]) -> None:
            for procs in group:
                procs.stop(grace=5.0)

        if by_home:
            with ThreadPoolExecutor(max_workers=len(by_home)) as pool:
                list(pool.map(stop_in_turn, by_home.values()))
        left: list[int] = []
        for home in {home for _procs, home, _proc in self.parts.values()}:
            left += processes_with_env("FLWR_HOME", str(home))
        return left
