"""Honest failure: a round in which fewer than ``min_results`` clients gave a valid update
stops the run (exit 3, one line naming the round, the cause and how many of how many), or,
under ``on_short_round: skip``, is skipped and counted; a run is never ``completed`` with a
model no round trained. The rule is the round loop's, so it holds for every executor: here
in-process (clients made to time out), on worker processes and through Flower's message path
(tiny runs), and on Flower's simulation runtime (the drill, slow)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from tiny import TINY_DOC, tiny_config

from fedbug.cli import main
from fedbug.engine import run_experiment
from fedbug.engine.executors import SequentialExecutor
from fedbug.errors import ShortRoundError

TIMEOUT = "no reply within round_timeout (0.05 s)"


@pytest.fixture(autouse=True)
def _fast(no_plots):
    """No plots (most of a tiny run's time)."""


def clients_time_out(monkeypatch: pytest.MonkeyPatch, rounds: set[int]) -> None:
    """In ``rounds`` no selected client's update comes back, each one lost as a Flower client
    that misses ``round_timeout`` is (``lost()``); the other rounds train as usual."""

    class TimingOut(SequentialExecutor):
        lost_now: list[dict] = []

        def stream_round(self, weights, tasks, states):
            self.lost_now = []
            if tasks and tasks[0].round in rounds:
                self.lost_now = [{"client": t.client, "reason": TIMEOUT} for t in tasks]
                return
            yield from super().stream_round(weights, tasks, states)

        def lost(self):
            return list(self.lost_now)

    monkeypatch.setattr("fedbug.engine.executors.SequentialExecutor", TimingOut)


def write_yaml(tmp_path: Path, **overrides) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", **TINY_DOC, **overrides}))
    return path


def only_run(out: Path) -> Path:
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir


def rounds_in(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["round"] for line in lines]


# -- in-process -----------------------------------------------------------------------------


def test_a_round_no_client_reported_stops_the_run_with_exit_3(tmp_path, monkeypatch, capsys):
    clients_time_out(monkeypatch, {2})
    out = tmp_path / "out"
    code = main(["run", str(write_yaml(tmp_path)), "--out", str(out), "-q"])
    cap = capsys.readouterr()
    assert code == 3, cap
    err = cap.err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedbug: error: "), err
    assert "round 2" in err and "0 of 2 selected clients" in err and "min_results" in err
    assert "2 x no reply within round_timeout (0.05 s)" in err
    assert "on_short_round: skip" in err
    assert "final test accuracy" not in cap.out
    rd = only_run(out)
    assert rounds_in(rd) == [1]  # the rounds before, as a diverged run keeps them
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["status"] == "stopped"
    short = summary["short_round"]
    assert (short["round"], short["reported"], short["selected"], short["required"]) == (2, 0, 2, 1)
    assert [d["reason"] for d in short["dropped"]] == [TIMEOUT, TIMEOUT]
    assert not (rd / ".lock").exists()


def test_the_error_carries_the_round_and_counts(monkeypatch):
    clients_time_out(monkeypatch, {1})
    with pytest.raises(ShortRoundError) as info:
        run_experiment(tiny_config(count_flops=False, threads=1, min_results=2))
    e = info.value
    assert e.exit_code == 3
    assert (e.round, e.reported, e.selected, e.required) == (1, 0, 3, 2)
    assert "fewer than min_results (2)" in str(e)


def test_skip_goes_on_counts_the_skipped_rounds_and_says_so(tmp_path, monkeypatch, capsys):
    clients_time_out(monkeypatch, {2})
    out = tmp_path / "out"
    path = write_yaml(tmp_path, rounds=3)
    code = main(["run", str(path), "--out", str(out), "-q", "-s", "on_short_round=skip"])
    cap = capsys.readouterr()
    assert code == 0, cap
    warning = cap.err.strip()
    assert len(warning.splitlines()) == 1 and warning.startswith("fedbug: warning: "), warning
    assert "1 of 3 rounds skipped" in warning and "round 2" in warning, warning
    rd = only_run(out)
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["status"] == "completed"
    assert summary["skipped_rounds"] == [2]
    second = [json.loads(x) for x in (rd / "metrics.jsonl").read_text().splitlines()][1]
    assert second["aggregated"] is False and len(second["dropped"]) == 2


def test_skip_of_every_round_is_never_completed(tmp_path, monkeypatch, capsys):
    """All rounds skipped: the model is the untrained one, so the run is not completed."""
    clients_time_out(monkeypatch, {1, 2})
    out = tmp_path / "out"
    path = write_yaml(tmp_path)
    code = main(["run", str(path), "--out", str(out), "-q", "-s", "on_short_round=skip"])
    cap = capsys.readouterr()
    assert code == 3, cap
    assert "no round was aggregated" in cap.err and "untrained" in cap.err, cap.err
    assert "final test accuracy" not in cap.out
    summary = json.loads((only_run(out) / "summary.json").read_text())
    assert summary["status"] == "stopped" and summary["skipped_rounds"] == [1, 2]


def test_skip_is_not_in_the_config_hash():
    """A run stopped by a short round resumes with on_short_round: skip (its checkpoint's hash
    still matches), as it does with a longer flower.round_timeout."""
    from fedbug.config import config_hash

    base = tiny_config()
    assert config_hash(tiny_config(on_short_round="skip")) == config_hash(base)


def _all_clients_diverge(executor: str) -> None:
    cfg = tiny_config(
        lr=1e6, on_divergence="skip_client", count_flops=False, threads=1, executor=executor
    )
    with pytest.raises(ShortRoundError) as info:
        run_experiment(cfg)
    msg = str(info.value)
    assert "round 1" in msg and "0 of 3 selected clients" in msg
    assert "3 x" in msg and "non-finite" in msg, msg


def test_every_client_dropped_by_skip_client_stops_in_process():
    """Every update diverging and dropped (``on_divergence: skip_client``) was a completed run
    of the untrained model."""
    _all_clients_diverge("sequential")


@pytest.mark.slow
def test_every_client_dropped_by_skip_client_stops_on_worker_processes():
    _all_clients_diverge("processes")


# -- Flower ---------------------------------------------------------------------------------


def test_flower_clients_that_miss_the_timeout_stop_the_run():
    """Through Flower's message path (a test Grid in this process): every node silent."""
    pytest.importorskip("flwr")
    from flowergrid import LoopbackGrid, task_identity

    from fedbug.integrations.flower.clientapp import app as client_app
    from fedbug.integrations.flower.executor import FlowerExecutor

    cfg = tiny_config(
        rounds=1,
        threads=1,
        num_clients=4,
        clients_per_round=4,
        executor="flower-simulation",
        flower={"round_timeout": 0.2, "poll_interval": 0.05},
    )
    run_config = {"config": json.dumps(cfg.model_dump(mode="json"))}
    grid = LoopbackGrid(client_app, 4, run_config, silent={100, 101, 102, 103})
    with task_identity(), pytest.raises(ShortRoundError) as info:
        run_experiment(cfg, executor_factory=lambda exp: FlowerExecutor(grid, exp, map_once=True))
    msg = str(info.value)
    assert "0 of 4 selected clients" in msg
    assert "4 x no reply within round_timeout (0.2 s)" in msg
    assert "flower.round_timeout" in msg, msg


SMOKE = Path(__file__).resolve().parents[2] / "configs" / "flower-smoke.yaml"


@pytest.mark.slow
def test_the_drill_on_flower_simulation_exits_3(tmp_path, capsys):
    """The issue's drill: a 0.05 s round timeout on Flower's simulation runtime. Before: every
    client dropped in every round, ``completed``, exit 0, "final test accuracy 10.42%"."""
    pytest.importorskip("flwr")
    from flowergrid import processes_with_env

    out = tmp_path / "out"
    flags = ["-s", "executor=flower-simulation", "-s", "flower.round_timeout=0.05"]
    code = main(["run", str(SMOKE), *flags, "--out", str(out), "-q"])
    cap = capsys.readouterr()
    assert code == 3, cap
    err = cap.err.strip()
    assert len(err.splitlines()) == 1, err
    assert "round 1" in err and "0 of 4 selected clients" in err and "round_timeout" in err
    assert "final test accuracy" not in cap.out
    rd = only_run(out)
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["status"] == "stopped"
    assert processes_with_env("FLWR_HOME", str(rd / ".flower")) == []
    print(err, file=sys.stderr)


def test_resuming_a_stopped_run_without_a_checkpoint_says_how_it_ended(
    tmp_path, monkeypatch, capsys
):
    """It was called "a finished run"; a run stopped by a short round is none."""
    clients_time_out(monkeypatch, {1})
    out, cfg = tmp_path / "out", write_yaml(tmp_path)
    assert main(["run", str(cfg), "--out", str(out), "-q"]) == 3
    capsys.readouterr()
    assert main(["run", str(cfg), "--out", str(out), "-q", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "holds a run that ended 'stopped' but no checkpoint.pt" in err
