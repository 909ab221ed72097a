"""SIGKILL drill: a real ``fedbug run`` killed at 10 seeded random moments (during training,
evaluation, checkpoint writing, metrics writing and the other run-folder writes), then
``--resume``d, ends with the same metrics and weights as an uninterrupted run.

Every run is a separate process running ``fedbug.cli.main``: a fork of one helper process that
has imported torch, scikit-learn, matplotlib and fedbug once (importing them is ~6 s of a ~8 s
run on 2 cores; forked, a run takes about a second, so 10 kills and 10 resumes fit in well under
a minute). A moment is an event drawn by a seeded RNG, not a wall-clock time, so each drill
kills at the same places on any machine: the forked child installs a hook and SIGKILLs itself
when it reaches the drawn event, e.g. "round 3, in the middle of writing checkpoint.pt" (the
temporary file written, not yet fsynced and renamed) or "round 5, half of the metrics line
written". ``FEDBUG_TEST_SLOW_WRITES=0`` (a test-only hook in ``fedbug.results``) makes every
run-folder write and every metrics line pass through ``results.files._test_pause`` mid-write,
where those kills land.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tiny import without_timing

from fedbug.results import load_checkpoint_file

ROUNDS = 6
CONFIG = f"""\
name: drill
dataset: digits
model: mlp
num_clients: 6
clients_per_round: 2
rounds: {ROUNDS}
local_steps: 1
batch_size: 16
eval_batch_size: 512
checkpoint_every: 2
count_flops: false
threads: 1
"""
KILLS = 10
SEED = 20240601
PHASES = ("train", "eval", "checkpoint", "metrics", "write")  # each drawn KILLS / 5 times

# The helper: imports once, then for each JSON request on stdin forks a child that runs
# fedbug.cli.main(argv) with the kill hook armed; answers {"pid", "rc", "signal"} when the child
# ends. The child's stdout goes to /dev/null, its stderr to the file named in the request, and
# the events it passed (phase, round, file) to the "events" file when one is named.
SERVER = textwrap.dedent(
    """
    import json, os, signal, sys, time, traceback
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot
    import sklearn.datasets
    import torch, torch._dynamo
    import rich.progress
    import fedbug.cli, fedbug.engine, fedbug.results, fedbug.data.partition_plot
    import fedbug.engine.executors.sequential as seq
    from fedbug.data import digits

    def arm(kill, events_path):
        events = []
        state = {"phase": None, "round": None, "file": None, "seen": {}}

        def note(event):
            events.append(event)
            if events_path:
                with open(events_path, "w") as f:
                    json.dump(events, f)

        def hit(event):
            note(event)
            if kill is not None and event == kill:
                os.kill(os.getpid(), signal.SIGKILL)

        def pause():  # called mid-write: inside every atomic write and every metrics line
            if state["phase"] == "write":
                k = state["seen"][state["file"]]
                hit(["write", state["file"], k, "mid"])
            else:
                hit([state["phase"], state["round"], "mid"])

        train = seq.train_client
        def train_client(weights, task, *args):
            res = train(weights, task, *args)
            state["seen"]["train", task.round] = state["seen"].get(("train", task.round), 0) + 1
            hit(["train", task.round, state["seen"]["train", task.round]])
            return res

        evaluate = fedbug.engine.rounds.evaluate_round
        def evaluate_round(*args):
            state["seen"]["eval"] = state["seen"].get("eval", 0) + 1
            r = state["seen"]["eval"]
            hit(["eval", r, "start"])
            out = evaluate(*args)
            hit(["eval", r, "end"])
            return out

        write = fedbug.results.atomic_write_bytes
        def atomic_write_bytes(path, data):
            name = os.path.basename(str(path))
            if name == "checkpoint.pt":
                return write(path, data)  # the checkpoint phase is set by save_checkpoint
            state["seen"][name] = state["seen"].get(name, 0) + 1
            before = dict(state)
            state.update(phase="write", file=name)
            try:
                return write(path, data)
            finally:
                state.update(phase=before["phase"], file=before["file"])

        def phase(name, method):
            def wrapped(self, obj):
                state.update(phase=name, round=obj["round"])
                method(self, obj)
                state.update(phase=None)
                hit([name, obj["round"], "after"])
            return wrapped

        R = fedbug.results.RunDir
        R.append_metrics = phase("metrics", R.append_metrics)
        R.save_checkpoint = phase("checkpoint", R.save_checkpoint)
        fedbug.results.files._test_pause = pause
        for module in (fedbug.results, fedbug.results.files, fedbug.results.checkpoint,
                       fedbug.results.plot):  # where atomic_write_bytes is looked up
            module.atomic_write_bytes = atomic_write_bytes
        fedbug.data.partition_plot.atomic_write_bytes = atomic_write_bytes
        seq.train_client = train_client
        fedbug.engine.rounds.evaluate_round = evaluate_round

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            rc = 99
            try:
                out = os.open(os.devnull, os.O_WRONLY)
                err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(out, 1)
                os.dup2(err, 2)
                os.environ.update(req["env"])
                for key in req["unset"]:
                    os.environ.pop(key, None)
                arm(req["kill"], req.get("events"))
                rc = fedbug.cli.main(req["argv"])
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(rc)
        deadline, status, hung = time.monotonic() + 120, None, False
        while status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
            elif time.monotonic() > deadline:  # a hung run fails the drill, not the suite
                os.kill(pid, signal.SIGKILL)
                hung = True
                time.sleep(0.5)
            else:
                time.sleep(0.01)
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        rc = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        print(json.dumps({"pid": pid, "rc": rc, "signal": sig, "hung": hung}), flush=True)
    """
)


class Runner:
    """The forking helper process."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        env = {**os.environ, "MPLBACKEND": "Agg"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        assert json.loads(self.proc.stdout.readline()) == {"ready": True}
        self.n = 0

    def run(
        self, argv: list[str], kill: list | None = None, slow: bool = False, events: bool = False
    ) -> dict:
        self.n += 1
        err = self.tmp / f"stderr{self.n}.txt"
        req = {
            "argv": argv,
            "kill": kill,
            "stderr": str(err),
            "env": {"FEDBUG_TEST_SLOW_WRITES": "0"} if slow else {},
            "unset": [] if slow else ["FEDBUG_TEST_SLOW_WRITES"],
            "events": str(self.tmp / f"events{self.n}.json") if events else None,
        }
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the drill's helper process died"
        res = json.loads(line)
        res["stderr"] = err.read_text(encoding="utf-8", errors="replace")
        if events:
            res["events"] = json.loads(Path(req["events"]).read_text(encoding="utf-8"))
        return res

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def _argv(cfg: Path, out: Path, *extra: str) -> list[str]:
    return ["run", str(cfg), "--out", str(out), "-q", *extra]


def _run_dir(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def _final_state(run_dir: Path) -> tuple[list[dict], torch.Tensor]:
    text = (run_dir / "metrics.jsonl").read_text(encoding="utf-8")
    assert text.endswith("\n"), "metrics.jsonl ends with a partial line"
    records = [json.loads(line) for line in text.splitlines()]  # every line whole JSON
    weights = load_checkpoint_file(run_dir / "checkpoint.pt")["weights"]
    return without_timing(records), weights


def _leftovers(run_dir: Path) -> list[str]:
    return sorted(p.name for p in run_dir.iterdir() if ".tmp" in p.name or p.name == ".lock")


def draw_moments(rng: random.Random, writes: list[tuple[str, int]]) -> list[list]:
    """KILLS events, each phase of PHASES twice, rounds and positions from ``rng``."""
    moments = []
    checkpoint_rounds = [r for r in range(1, ROUNDS + 1) if r % 2 == 0]
    for phase in PHASES * (KILLS // len(PHASES)):
        r = rng.randint(1, ROUNDS)
        if phase == "train":
            moments.append(["train", r, rng.choice([1, 2])])  # after client 1 or 2 of 2
        elif phase == "eval":
            moments.append(["eval", r, rng.choice(["start", "end"])])
        elif phase == "checkpoint":
            moments.append(
                ["checkpoint", rng.choice(checkpoint_rounds), rng.choice(["mid", "after"])]
            )
        elif phase == "metrics":
            moments.append(["metrics", r, rng.choice(["mid", "after"])])
        else:
            name, k = rng.choice(writes)
            moments.append(["write", name, k, "mid"])
    return moments


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_equals_uninterrupted(tmp_path):
    cfg = tmp_path / "drill.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    runner = Runner(tmp_path)
    try:
        # the uninterrupted run, noting every event a kill can be drawn from
        base = runner.run(_argv(cfg, tmp_path / "base"), slow=True, events=True)
        assert base["rc"] == 0 and not base["hung"], base["stderr"]
        want_records, want_weights = _final_state(_run_dir(tmp_path / "base"))
        assert [r["round"] for r in want_records] == list(range(1, ROUNDS + 1))
        writes = sorted({(e[1], e[2]) for e in base["events"] if e[0] == "write"})
        names = {name for name, _ in writes}
        assert {"config.yaml", "partition.json", "summary.json", "accuracy.png"} <= names
        for event in draw_moments(random.Random(SEED), writes):
            assert event in base["events"], event  # every moment happens in a whole run

        moments = draw_moments(random.Random(SEED), writes)
        seen = []
        for i, moment in enumerate(moments):
            out = tmp_path / f"kill{i}"
            killed = runner.run(_argv(cfg, out), kill=moment, slow=True)
            assert killed["signal"] == signal.SIGKILL and not killed["hung"], (moment, killed)
            run_dir = _run_dir(out)
            raw = (run_dir / "metrics.jsonl").read_bytes()
            what = {
                "moment": moment,
                "torn_metrics": bool(raw) and not raw.endswith(b"\n"),
                "temp_files": sorted(p.name for p in run_dir.iterdir() if ".tmp" in p.name),
                "checkpoint": (run_dir / "checkpoint.pt").exists(),
                "lock": (run_dir / ".lock").exists(),
            }
            if moment[0] == "metrics" and moment[-1] == "mid":
                assert what["torn_metrics"], what
            if moment[-1] == "mid" and moment[0] in ("checkpoint", "write"):
                assert what["temp_files"], what  # killed between writing and renaming
            resumed = runner.run(_argv(cfg, out, "--resume"))
            assert resumed["rc"] == 0 and not resumed["hung"], (moment, resumed["stderr"])
            assert resumed["stderr"] == "", (moment, resumed["stderr"])
            assert _leftovers(run_dir) == [], moment
            summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
            assert summary["status"] == "completed"
            records, weights = _final_state(run_dir)
            assert records == want_records, f"kill {i} at {moment}"
            assert torch.equal(weights, want_weights), f"kill {i} at {moment}"
            seen.append(what)
    finally:
        runner.close()
    print(f"\ncrash drill: {len(seen)} SIGKILLs survived")
    for w in seen:
        print(f"crash drill: {w}")
    assert len(seen) == KILLS
    assert sum(bool(w["temp_files"]) for w in seen) >= 2
    assert sum(w["torn_metrics"] for w in seen) >= 1
