"""Start Flower for ``fedbug run`` with ``executor: flower-simulation`` or ``flower-deployment``.

Simulation: fedbug starts its own SuperLink on a free loopback port (``--simulation``), with
``FLWR_HOME`` in the run folder, submits the app with ``flwr run``, follows the run with
``flwr ls`` until it has finished, and stops everything it started (on Ctrl-C too).
Deployment: the SuperLink and SuperNodes are the user's (README); fedbug only submits the app
to ``flower.superlink`` and follows the run. In both, the ServerApp (a process the SuperLink
starts) runs the round loop and writes the run folder; this process shows its progress from
``metrics.jsonl`` and reads ``summary.json`` at the end.

This process holds the run folder's lock from before it touches ``.flower`` until everything
it started has stopped; the ServerApp joins that lock with its token and stops at its next
write once this process is gone. Killed with SIGTERM or SIGINT, this process stops what it
started; killed with SIGKILL, the SuperLink it started dies with it (Linux: the parent-death
signal) and takes its ServerApp along (Flower's own parent monitor), and the next ``fedbug run
--resume`` on the folder ends whatever of that run is left before it starts.

Flower's programs (``flower-superlink``, ``flwr``, and what the SuperLink starts in turn:
:data:`PROGRAMS`) are found on ``PATH``, else beside this Python's interpreter (a virtualenv's
``bin``, where pip put them): ``.venv/bin/fedbug run`` works without the virtualenv activated.
They are looked up before the run folder is made; one missing is a :class:`ConfigError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fedbug.core.process import die_with_parent
from fedbug.errors import ConfigError, DivergenceError, FedbugError, ShortRoundError
from fedbug.integrations.flower import INSTALL_HINT, require_flower
from fedbug.models import import_root, is_import_path
from fedbug.results import RunDir, new_records, pid_alive

APP_NAME = "fedbug-app"
CONNECTION = "fedbug"

PYPROJECT = """\
# A Flower app whose components are fedbug's installed modules: each host needs
# pip install "fedbug[flower]". Written by `fedbug flower app`.
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{name}"
version = "1.0.0"
description = "fedbug experiments on Flower"
license = "Apache-2.0"
dependencies = ["fedbug[flower]"]

[tool.flwr.app]
publisher = "fedbug"

[tool.flwr.app.components]
serverapp = "fedbug.integrations.flower.serverapp:app"
clientapp = "fedbug.integrations.flower.clientapp:app"

# The run config fedbug passes with `flwr run --run-config FILE.toml`; other keys are refused.
[tool.flwr.app.config]
config = "{{}}"
out = ""
resume = false
data-dir = ""
lock-token = ""
node-state-dir = ""
pooled-nodes = false
"""


#: virtual SuperNodes a simulation starts unless ``flower.supernodes`` says: any of them trains
#: any client, so there is no need for a node a client (10,000 for 10,000 clients), whose
#: contexts Flower's engine keeps and polls ten times a second (on W, 100 nodes and 16 measured
#: the same round time: benchmarks/RESULTS.md)
POOL = 16


class FlowerRunError(FedbugError):
    """Flower could not start, or the run on Flower failed (the message says where to look)."""

    exit_code = 1


def write_app(directory: Path) -> Path:
    """Write the Flower app (a pyproject.toml only) into ``directory``; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pyproject.toml").write_text(PYPROJECT.format(name=APP_NAME))
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: the programs each Flower executor needs: those this process starts (the SuperLink, ``flwr``)
#: and those Flower starts by name in turn (the SuperLink its SuperExec, which starts the
#: simulation); each is looked up on :func:`flower_path`
PROGRAMS: dict[str, tuple[str, ...]] = {
    "flower-simulation": ("flower-superlink", "flwr", "flower-superexec", "flwr-simulation"),
    "flower-deployment": ("flwr",),
}


def _interpreter_folder() -> str:
    """The folder of this Python's interpreter, not resolved (a virtualenv's ``bin``)."""
    return str(Path(sys.executable).parent) if sys.executable else ""


def flower_path(path: str | None = None) -> str:
    """The ``PATH`` of every Flower process fedbug starts: ``path`` (by default this process's),
    then the folder of this Python's interpreter when ``path`` lacks it. A program on ``PATH``
    comes first; a virtualenv's Flower is found without the virtualenv activated, by fedbug's
    launch and by the SuperLink's own launches alike. An empty entry (the current folder, on
    POSIX) is left out: a program planted in a received run folder is never started."""
    path = os.environ.get("PATH", os.defpath) if path is None else path
    parts = [p for p in path.split(os.pathsep) if p]
    here = _interpreter_folder()
    if here and here not in parts:
        parts.append(here)
    return os.pathsep.join(parts)


def check_programs(executor: str, path: str | None = None) -> dict[str, str]:
    """Where each program of ``executor`` (:data:`PROGRAMS`) is on ``path`` (by default
    :func:`flower_path`); a missing one is one :class:`ConfigError` naming it and the fix."""
    path = flower_path() if path is None else path
    found = {name: shutil.which(name, path=path) for name in PROGRAMS.get(executor, ())}
    missing = [name for name, where in found.items() if where is None]
    if missing:
        what = f"program {missing[0]}" if len(missing) == 1 else f"programs {', '.join(missing)}"
        here = _interpreter_folder()
        where = f"on PATH or beside this Python ({here})" if here else "on PATH"
        raise ConfigError(
            f"executor {executor} needs the {what}, not found {where}; install flwr into this "
            f"environment ({INSTALL_HINT}) or activate its virtualenv"
        )
    return {name: str(where) for name, where in found.items()}


def flower_env(
    home: Path, ray_tmp: Path | None = None, python_path: list[str] | None = None
) -> dict[str, str]:
    """The environment of every Flower process fedbug starts (``python_path`` before the
    ``PYTHONPATH`` this process has; ``PATH``: :func:`flower_path`)."""
    env = dict(os.environ)
    env["PATH"] = flower_path()
    if python_path:
        env["PYTHONPATH"] = os.pathsep.join(
            [*python_path, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
    env.update(
        FLWR_HOME=str(home),
        FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1",
        PYTHONUNBUFFERED="1",
    )
    if ray_tmp is not None:
        env["RAY_TMPDIR"] = str(ray_tmp)
    return env


def write_connection(home: Path, address: str, root_certificates: str | None = None) -> None:
    """``$FLWR_HOME/config.toml`` with one connection, the default, named ``fedbug``."""
    home.mkdir(parents=True, exist_ok=True)
    security = (
        f'root-certificates = "{Path(root_certificates).expanduser().resolve()}"'
        if root_certificates
        else "insecure = true"
    )
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{CONNECTION}"\n\n'
        f'[superlink.{CONNECTION}]\naddress = "{address}"\n{security}\n'
    )


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def processes_with_env(name: str, value: str) -> list[int]:
    """Live processes (Linux: read from /proc) whose environment holds ``name=value``."""
    needle = f"{name}={value}".encode()
    found: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for d in proc.iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            state = (d / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in env:
            found.append(int(d.name))
    return found


def kill_with_env(name: str, value: str, grace: float = 10.0) -> None:
    """SIGKILL every process whose environment holds ``name=value`` (a run's ``FLWR_HOME``:
    what Flower and Ray started for it) until none is left or ``grace`` seconds pass."""
    end = time.monotonic() + grace
    while (left := processes_with_env(name, value)) and time.monotonic() < end:
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


class Processes:
    """Processes fedbug started (each dies with this process on Linux); :meth:`stop` ends them
    all (TERM, then KILL), by group, and then any process left that carries this run's
    ``FLWR_HOME`` (Ray starts its own sessions).
    """

    def __init__(self, home: Path | None = None) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.home = home

    def start(self, cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            p = subprocess.Popen(
                cmd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
        self.procs.append(p)
        return p

    def stop(self, grace: float = 10.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGTERM)
        end = time.monotonic() + grace
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.1, end - time.monotonic()))
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        # the process group may hold children (the ServerApp, Ray) that outlived their parent
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        self.procs.clear()
        if self.home is not None:
            kill_with_env("FLWR_HOME", str(self.home), grace)


def _flwr(args: list[str], env: dict[str, str], timeout: float = 120.0) -> dict[str, Any]:
    """Run a ``flwr`` command with ``--format json``; its JSON answer."""
    done = subprocess.run(
        ["flwr", *args, "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    text = done.stdout.strip()
    try:
        answer = json.loads(text[text.index("{") :]) if "{" in text else {}
    except json.JSONDecodeError:
        answer = {}
    if done.returncode != 0 or not answer.get("success", True):
        reason = answer.get("error-message") or (done.stderr or text).strip().splitlines()[-1:]
        raise FlowerRunError(f"flwr {args[0]} failed: {reason}")
    return answer


def _wait_for_superlink(env: dict[str, str], proc: subprocess.Popen[bytes], log: Path) -> None:
    end = time.monotonic() + 60
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise FlowerRunError(f"the SuperLink exited ({proc.returncode}); see {log}")
        with contextlib.suppress(FlowerRunError, subprocess.TimeoutExpired):
            _flwr(["ls", CONNECTION], env, timeout=20)
            return
        time.sleep(0.5)
    raise FlowerRunError(f"the SuperLink did not answer within 60 s; see {log}")


def _status(env: dict[str, str], run_id: int) -> str:
    answer = _flwr(["ls", CONNECTION, "--run-id", str(run_id)], env, timeout=60)
    runs = answer.get("runs") or []
    return str(runs[0].get("status", "")) if runs else ""


#: the longest wait between two run-status checks. Each is a `flwr ls` process, about a second
#: of CPU: checked every second, it took a share of a core from training on 2 cores and slowed
#: clients of 2 torch threads on the simulation about 2x (benchmarks/RESULTS.md, "Flower
#: overhead"). The run's end is seen at once anyway: the ServerApp writes summary.json.
STATUS_EVERY = 15.0


def _wait_finished(
    env: dict[str, str],
    run_id: int,
    summary: Path,
    started: float,
    on_round: Callable[[dict[str, Any]], None] | None,
) -> str:
    """Follow the run's metrics until Flower reports it finished; its final status. The status
    is checked after 1 s, then at doubling waits up to :data:`STATUS_EVERY` (a run that fails
    is seen within that), and every 0.5 s once the ServerApp has written the run's summary."""
    metrics = summary.parent / "metrics.jsonl"
    seen, wait = 0, 1.0
    due = time.monotonic() + wait
    while True:
        seen = _follow(metrics, seen, on_round)
        ended = summary.exists() and summary.stat().st_mtime >= started
        if ended or time.monotonic() >= due:
            status = _status(env, run_id)
            if status.startswith("finished"):
                _follow(metrics, seen, on_round)
                return status
            wait = 0.5 if ended else min(2 * wait, STATUS_EVERY)
            due = time.monotonic() + wait
        time.sleep(0.25)


def _follow(metrics: Path, seen: int, on_round: Callable[[dict[str, Any]], None] | None) -> int:
    """Report the rounds written to ``metrics`` past byte ``seen`` (each line read once, as a
    run reads its own: checked, its checksum taken off); the new offset."""
    if on_round is None:
        return seen
    records, seen = new_records(metrics, seen)
    for record in records:
        on_round(record)
    return seen


#: Ray's session folders of fedbug's simulations, under /tmp (Ray's sockets need short paths)
RAY_TMP_PREFIX = "fbray"
#: the pid of the launcher that made a Ray session folder, written in it
RAY_TMP_OWNER = "fedbug-owner.pid"


def client_cpus(cfg: Any) -> float:
    """The CPUs Ray gives each simulated client: ``flower.num_cpus``, else ``threads``. Fewer
    than ``threads`` is allowed, with a warning: Ray then runs more torch threads than cores,
    which wait on each other at every step (W on 2 cores: 3.8x slower, benchmarks/RESULTS.md)."""
    cpus = float(cfg.flower.num_cpus or cfg.threads)
    if cpus < cfg.threads:
        warnings.warn(
            f"flower.num_cpus={cpus:g} is below threads={cfg.threads}: Ray will run more torch "
            "threads than CPUs and every client slows down; set flower.num_cpus to threads "
            "(or threads to 1 to train more clients at once)",
            stacklevel=2,
        )
    return cpus


@contextlib.contextmanager
def _ray_tmp(root: Path | None = None) -> Iterator[Path]:
    """A folder for Ray's session, removed on the way out. A launcher killed with SIGKILL cannot
    remove its own; the next launcher removes every such folder whose owner is gone."""
    root = root or (Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir()))
    _remove_orphaned_ray_tmp(root)
    path = Path(tempfile.mkdtemp(prefix=RAY_TMP_PREFIX, dir=root))
    (path / RAY_TMP_OWNER).write_text(f"{os.getpid()}\n")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _remove_orphaned_ray_tmp(root: Path) -> None:
    for folder in root.glob(f"{RAY_TMP_PREFIX}*"):
        try:
            owner = int((folder / RAY_TMP_OWNER).read_text())
        except (OSError, ValueError):
            continue  # not one this fedbug made, or still being made: left alone
        if not pid_alive(owner):
            shutil.rmtree(folder, ignore_errors=True)


def run_on_flower(
    cfg: Any,
    run_dir: Path,
    *,
    resume: bool = False,
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` on Flower (its ``executor`` says simulation or deployment) writing
    ``run_dir``; return the run's summary (``summary.json``)."""
    require_flower(f"executor {cfg.executor}")
    check_programs(cfg.executor)  # before the run folder: a missing program leaves none
    from fedbug.config import resolve

    cfg = resolve(cfg)
    rd = RunDir(Path(run_dir).resolve())
    rd.create()
    rd.acquire_lock()  # before anything touches the folder, .flower included
    try:
        with _sigterm_interrupts():
            return _run_locked(cfg, rd, resume, on_round)
    finally:
        rd.release_lock()


def run_flower_experiment(
    cfg: Any,
    run_dir: Path | str | None,
    *,
    resume: bool = False,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    task: str | None = None,
    unsupported: list[str] | None = None,
) -> Any:
    """``fedbug.run`` on Flower: :func:`run_on_flower`, its results read back (checked) as a
    :class:`~fedbug.engine.RunResult`. What the nodes cannot rebuild from the config (objects:
    a data set, a model, a loss) is refused, naming the config's way to say it."""
    from fedbug.engine import RunResult

    if unsupported:
        raise ConfigError(
            f"executor {cfg.executor}: Flower nodes build the run from its config, so "
            f"{', '.join(unsupported)} cannot be passed as Python objects; name them in the "
            "config instead (your own model by import path, model: 'package.module:Name'; a "
            "task by name, task: regression; your data set as a registered one), or run "
            "in-process (executor: sequential)"
        )
    if run_dir is None:
        raise ConfigError(
            f"executor {cfg.executor} needs run_dir: the ServerApp writes the run folder there"
        )
    if task is not None:
        cfg = cfg.model_copy(update={"task": task})
    run_on_flower(cfg, Path(run_dir), resume=resume, on_round=on_round)
    rd = RunDir(Path(run_dir).resolve())
    done = rd.read_run()
    weights = rd.load_checkpoint()["weights"]
    return RunResult(rd.path, done["records"], done["summary"], weights)


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt here (as Ctrl-C does), so that what this process started
    is stopped on the way out. Only in the main thread, where Python runs signal handlers."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _run_locked(
    cfg: Any, rd: RunDir, resume: bool, on_round: Callable[[dict[str, Any]], None] | None
) -> dict[str, Any]:
    """Submit the run to Flower, follow it to its end and stop what was started; the run's
    summary (or the error it ended with, as :func:`_summary` says)."""
    home = rd.path / ".flower"
    kill_with_env("FLWR_HOME", str(home))  # what a killed `fedbug run` here left running
    home.mkdir(exist_ok=True)
    app, run_config = _write_app_and_run_config(cfg, rd, home, resume)
    procs = Processes(home)
    log = home / "superlink.log"
    run_id: int | None = None
    python_path = _own_model_path(cfg)
    with _ray_tmp() as ray_tmp:
        env = flower_env(home, ray_tmp, python_path)
        try:
            if cfg.executor == "flower-simulation":
                extra = _start_simulation(cfg, home, env, procs, log)
            else:
                extra = _connect_deployment(cfg, home)
            started = time.time()
            answer = _flwr(
                ["run", str(app), CONNECTION, "--run-config", str(run_config), *extra], env
            )
            run_id = int(answer["run-id"])
            status = _wait_finished(env, run_id, rd.summary_path, started, on_round)
        except KeyboardInterrupt:
            _stop_deployment_run(cfg, env, run_id)
            raise
        finally:
            procs.stop()
    return _summary(cfg, rd, status, log)


def _write_app_and_run_config(cfg: Any, rd: RunDir, home: Path, resume: bool) -> tuple[Path, Path]:
    """The app and the run config ``flwr run`` submits, written under ``home``: (the app's
    folder, the run config's file)."""
    node_states = _node_states(cfg, rd, home, resume)
    app = write_app(home / "app")
    run_config = home / "run-config.toml"
    run_config.write_text(
        f"config = {_toml_str(json.dumps(cfg.model_dump(mode='json')))}\n"
        f"out = {_toml_str(str(rd.path))}\n"
        f"resume = {'true' if resume else 'false'}\n"
        f"data-dir = {_toml_str(cfg.data_dir or '')}\n"
        f"lock-token = {_toml_str(rd.lock_token or '')}\n"
        f"node-state-dir = {_toml_str(node_states)}\n"
        # simulated nodes share this machine's data and disk: any of them trains any client
        f"pooled-nodes = {'true' if cfg.executor == 'flower-simulation' else 'false'}\n"
    )
    return app, run_config


def _node_states(cfg: Any, rd: RunDir, home: Path, resume: bool) -> str:
    """The virtual nodes' disk on a simulation, in the run folder (emptied for a new run: no
    earlier run's states); ``""`` on a deployment."""
    if cfg.executor != "flower-simulation":
        return ""
    node_states = str(home / "node-states")
    if not resume and not rd.exists_with_results():
        shutil.rmtree(node_states, ignore_errors=True)
    return node_states


def _own_model_path(cfg: Any) -> list[str] | None:
    """Where a model named by import path is imported from: the nodes import it as this
    process does (``None`` for any other model)."""
    own = import_root(cfg.model) if is_import_path(cfg.model) else None
    return [str(own)] if own is not None else None


def _start_simulation(
    cfg: Any, home: Path, env: dict[str, str], procs: Processes, log: Path
) -> list[str]:
    """Start a simulation's SuperLink on a free loopback port and wait until it answers; the
    ``flwr run`` arguments that size its virtual nodes."""
    # the simulated nodes' built client side beside the run, not in the user's home
    env.setdefault("FEDBUG_NODE_CACHE", str(home / "node-cache"))
    port = free_port()
    write_connection(home, f"127.0.0.1:{port}")
    link = procs.start(
        [
            "flower-superlink",
            "--simulation",
            "--insecure",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--disable-runtime-dependency-installation",
        ],
        env,
        log,
    )
    _wait_for_superlink(env, link, log)
    nodes = cfg.flower.supernodes or min(cfg.num_clients, POOL)
    cpus = client_cpus(cfg)
    return [
        "--federation-config",
        f"num-supernodes={nodes} client-resources-num-cpus={cpus:g}",
    ]


def _connect_deployment(cfg: Any, home: Path) -> list[str]:
    """Point ``flwr`` at the user's SuperLink (``flower.superlink``); no extra ``flwr run``
    arguments."""
    if not cfg.flower.superlink:
        raise FlowerRunError(
            "executor flower-deployment needs flower.superlink (HOST:PORT of a "
            "running SuperLink); see the README's Flower section"
        )
    write_connection(home, cfg.flower.superlink, cfg.flower.root_certificates)
    return []


def _stop_deployment_run(cfg: Any, env: dict[str, str], run_id: int | None) -> None:
    """On Ctrl-C, stop the run submitted to a deployment (a simulation's stops with the
    SuperLink this process started)."""
    if run_id is not None and cfg.executor == "flower-deployment":
        with contextlib.suppress(FedbugError, subprocess.TimeoutExpired):
            _flwr(["stop", str(run_id), CONNECTION], env, timeout=30)


def _summary(cfg: Any, rd: RunDir, status: str, log: Path) -> dict[str, Any]:
    """The finished run's summary; a run that diverged or stopped on a short round raises as it
    would in this process, and one that did not complete says where its log is."""
    summary = rd.read_summary() if rd.summary_path.exists() else {}
    if summary.get("status") == "diverged":
        d = summary.get("divergence", {})
        raise DivergenceError(
            f"training diverged in round {d.get('round')} (client {d.get('client')}): "
            f"{d.get('reason')}; lower lr or set on_divergence: skip_client",
            int(d.get("round") or 0),
            d.get("client"),
            str(d.get("reason")),
        )
    if summary.get("status") == "stopped":  # a short round (the ServerApp's ShortRoundError)
        d = summary.get("short_round", {})
        raise ShortRoundError(
            str(d.get("message") or "a round had too few valid updates; see summary.json"),
            *(int(d.get(k) or 0) for k in ("round", "reported", "selected", "required")),
        )
    if status != "finished:completed" or not summary:
        raise FlowerRunError(
            f"the run on Flower ended {status or 'without a status'}; the ServerApp's log is in "
            f"{log if cfg.executor == 'flower-simulation' else 'the SuperLink output'}"
        )
    return summary
