"""Reliability: divergence, malformed updates, the run-folder lock, an unwritable --out."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tiny import TINY_DOC, TwoLayer, runtime, tiny_config

from fedbug.cli import main
from fedbug.config import config_hash
from fedbug.engine import run_experiment
from fedbug.engine.checks import check_update, is_divergence
from fedbug.engine.client import ClientResult
from fedbug.engine.executors import SequentialExecutor
from fedbug.errors import DivergenceError, RunFolderBusy
from fedbug.results import RunDir


@pytest.fixture(autouse=True)
def _fast(no_plots):
    """No plots (most of a tiny run's time)."""


def cfg(**overrides):
    return tiny_config(count_flops=False, threads=1, **overrides)


def corrupt_round(monkeypatch: pytest.MonkeyPatch, round: int, change) -> None:
    """Make the executor hand back ``change(result)`` for the first client of ``round``."""

    class Corrupting(SequentialExecutor):
        def stream_round(self, weights, tasks, states):
            for k, res in enumerate(super().stream_round(weights, tasks, states)):
                if k == 0 and tasks and tasks[0].round == round:
                    change(res)
                yield res

    monkeypatch.setattr("fedbug.engine.executors.SequentialExecutor", Corrupting)


def nan_delta(res: ClientResult) -> None:
    res.delta[0] = float("nan")


def read_metrics(rd: Path) -> list[dict]:
    return [json.loads(line) for line in (rd / "metrics.jsonl").read_text().splitlines()]


def write_yaml(tmp_path: Path, **overrides) -> Path:
    doc = {"name": "tiny", **TINY_DOC, **overrides}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


# -- check_update ---------------------------------------------------------------------------


def good_result() -> tuple[ClientResult, object]:
    space = runtime(TwoLayer()).space
    res = ClientResult(
        client=3,
        num_samples=5,
        delta=torch.zeros(space.total),
        trained=[True] * space.num_units,
        state={},
        train_loss=0.5,
    )
    return res, space


def test_check_update_accepts_a_well_formed_update():
    res, space = good_result()
    assert check_update(res, space) is None


@pytest.mark.parametrize(
    ("change", "words", "divergence"),
    [
        (lambda r, s: setattr(r, "delta", torch.zeros(s.total + 1)), "shape", False),
        (lambda r, s: setattr(r, "delta", torch.zeros(s.total, 2)), "shape", False),
        (lambda r, s: setattr(r, "delta", [0.0] * s.total), "not a tensor", False),
        (lambda r, s: setattr(r, "uploaded", [True]), "uploaded has 1", False),
        (lambda r, s: setattr(r, "trained", [True] * (s.num_units + 1)), "trained has", False),
        (lambda r, s: setattr(r, "num_samples", 0), "num_samples", False),
        (lambda r, s: setattr(r, "num_samples", -3), "num_samples", False),
        (lambda r, s: setattr(r, "train_loss", float("inf")), "train loss", True),
        (lambda r, s: r.delta.__setitem__(1, float("nan")), "weights", True),
    ],
    ids=["long", "2d", "list", "uploaded", "trained", "zero-n", "neg-n", "inf-loss", "nan-delta"],
)
def test_check_update_names_each_fault(change, words, divergence):
    res, space = good_result()
    change(res, space)
    reason = check_update(res, space)
    assert reason is not None and words in reason
    assert is_divergence(reason) is divergence


# -- divergence ----------------------------------------------------------------------------


def test_high_lr_exits_3_naming_round_client_and_cause(tmp_path, capsys):
    path = write_yaml(tmp_path, lr=1e6)
    out = tmp_path / "out"
    code = main(["run", str(path), "--out", str(out), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 3
    assert len(err.splitlines()) == 1
    m = re.search(r"diverged in round (\d+): client (\d+)'s update", err)
    assert m and "learning rate is likely too high" in err, err
    r, client = int(m[1]), int(m[2])
    (rd,) = list(out.iterdir())
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["status"] == "diverged"
    assert summary["divergence"]["round"] == r
    assert summary["divergence"]["client"] == client
    assert [x["round"] for x in read_metrics(rd)] == list(range(1, r))  # the rounds before
    assert not (rd / ".lock").exists()


def test_a_sweep_goes_on_past_a_diverged_run_and_resume_reads_it_back(tmp_path, capsys):
    """A diverged cell is a result of the sweep: the other cells run, the table leaves the
    diverged seed out and says so, the exit code is 4; --resume reads it back (not again)."""
    grid = {"lr": [0.1, 1e6]}
    path = write_yaml(tmp_path, grid=grid, seeds=1)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "-q"]) == 4
    first = capsys.readouterr()
    err = [x for x in first.err.splitlines() if x.startswith("fedbug:")]
    assert len(err) == 1 and "1 run(s) diverged (lr-1000000.0-s0)" in err[0], err
    rows = {
        r["label"]: r for r in json.loads((out / "tiny-sweep" / "sweep.json").read_text())["rows"]
    }
    bad, good = rows["lr=1000000.0"], rows["lr=0.1"]
    assert bad["final_acc_n"] == 0 and len(bad["diverged_runs"]) == 1
    assert good["final_acc_n"] == 1 and good["diverged_runs"] == []
    assert "| lr=1000000.0 (1 of 1 diverged) | 1 | - | - |" in first.out
    summary = out / "tiny-sweep" / "lr-1000000.0-s0" / "summary.json"
    stamp = summary.stat().st_mtime_ns
    assert main(["sweep", str(path), "--out", str(out), "-q", "--resume"]) == 4
    again = capsys.readouterr()
    assert summary.stat().st_mtime_ns == stamp  # read back, not run again
    assert again.out == first.out


def test_fedbug_report_on_simulated_runs_leaves_a_diverged_run_out_and_names_it(tmp_path, capsys):
    """The FreezeFL table (runs with a simulated clock) names a diverged run under the table and
    keeps its figures out of the means and FedAvg's baseline."""
    grid = {"lr": [0.1, 1e6]}
    system = {"abilities": "uniform"}
    path = write_yaml(tmp_path, grid=grid, seeds=1, system=system, count_flops=True)
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "-q"]) == 4
    capsys.readouterr()
    assert main(["report", str(out / "tiny-sweep")]) == 0
    text = capsys.readouterr().out
    assert "Diverged, left out: lr-1000000.0-s0." in text
    assert "lr=1000000.0" not in text.split("Diverged")[0]


def test_divergence_keeps_the_rounds_before(tmp_path, monkeypatch):
    corrupt_round(monkeypatch, 2, nan_delta)
    rd = tmp_path / "run"
    with pytest.raises(DivergenceError) as info:
        run_experiment(cfg(rounds=3), rd)
    assert info.value.exit_code == 3
    assert info.value.round == 2 and info.value.client is not None
    assert "round 2" in str(info.value)
    assert [r["round"] for r in read_metrics(rd)] == [1]
    summary = json.loads((rd / "summary.json").read_text())
    assert summary["status"] == "diverged"
    assert summary["divergence"]["round"] == 2
    assert summary["divergence"]["client"] == info.value.client
    assert summary["rounds"] == 1
    assert not (rd / ".lock").exists()


def test_skip_client_drops_the_diverged_update_and_goes_on(tmp_path, monkeypatch):
    corrupt_round(monkeypatch, 1, nan_delta)
    res = run_experiment(cfg(on_divergence="skip_client"), tmp_path / "run")
    first = res.records[0]
    (dropped,) = first["dropped"]
    assert "non-finite" in dropped["reason"]
    assert dropped["client"] not in first["clients"]
    assert first["num_clients"] == 2
    assert res.summary["status"] == "completed"
    assert torch.isfinite(res.weights).all()
    assert [r["round"] for r in read_metrics(tmp_path / "run")] == [1, 2]


def test_non_finite_global_weights_stop_even_with_skip_client(monkeypatch):
    import fedbug.engine as engine
    from fedbug.algorithms.base import ServerStep

    real = engine.Experiment.__init__

    def init(self, *args, **kwargs):
        real(self, *args, **kwargs)
        update = self.algorithm.server_update

        def poisoned(weights, agg, state, r, n):
            step = update(weights, agg, state, r, n)
            w = step.weights.clone()
            w[-1] = float("inf")
            return ServerStep(w, w, step.state, step.metrics)

        self.algorithm.server_update = poisoned

    monkeypatch.setattr(engine.Experiment, "__init__", init)
    with pytest.raises(DivergenceError) as info:
        run_experiment(cfg(on_divergence="skip_client"))
    assert info.value.round == 1 and info.value.client is None
    assert "global weights" in str(info.value)


# -- malformed updates ---------------------------------------------------------------------


def test_malformed_update_is_dropped_and_the_round_goes_on(monkeypatch):
    def short(res: ClientResult) -> None:
        res.delta = res.delta[:-1]

    corrupt_round(monkeypatch, 1, short)
    res = run_experiment(cfg())
    first = res.records[0]
    (dropped,) = first["dropped"]
    assert "shape" in dropped["reason"]
    assert first["num_clients"] == 2 and "aggregated" not in first
    assert res.summary["status"] == "completed"


def test_too_few_valid_updates_leave_the_weights_unchanged(monkeypatch):
    seen: list[torch.Tensor] = []

    class Recording(SequentialExecutor):
        def stream_round(self, weights, tasks, states):
            seen.append(weights.clone())
            for k, res in enumerate(super().stream_round(weights, tasks, states)):
                if k == 0 and tasks[0].round == 1:
                    res.num_samples = 0
                yield res

    monkeypatch.setattr("fedbug.engine.executors.SequentialExecutor", Recording)
    res = run_experiment(cfg(min_results=3, on_short_round="skip"))  # stop: tests/reliability
    first, second = res.records
    assert first["aggregated"] is False
    assert first["dropped"][0]["reason"].startswith("num_samples")
    assert first["test_acc"] is not None
    assert torch.equal(seen[0], seen[1])  # round 2 started from the initial weights
    assert "aggregated" not in second and not torch.equal(res.weights, seen[1])


def test_new_keys_at_their_defaults_keep_the_config_hash():
    base = cfg()
    assert config_hash(cfg(on_divergence="stop", min_results=1)) == config_hash(base)
    assert config_hash(cfg(min_results=2)) != config_hash(base)
    assert config_hash(cfg(on_divergence="skip_client")) != config_hash(base)


# -- the run-folder lock -------------------------------------------------------------------

#: another process holding a folder's lock as a run does: flock on .lock, its pid written
HOLD_LOCK = (
    "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
    "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'%d\\n' % os.getpid()); "
    "print('locked', flush=True); time.sleep(60)"
)


def test_a_second_run_on_a_locked_folder_exits_2_naming_the_pid(tmp_path, capsys):
    from fedbug.cli import run_dir_for
    from fedbug.config import load_config

    path = write_yaml(tmp_path)
    out = tmp_path / "out"
    rd = run_dir_for(load_config(path), out)
    rd.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(rd / ".lock")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        code = main(["run", str(path), "--out", str(out), "-q"])
        err = capsys.readouterr().err.strip()
        assert code == 2
        assert f"pid {holder.pid}" in err and len(err.splitlines()) == 1
        assert sorted(p.name for p in rd.iterdir()) == [".lock"]  # nothing written
        assert (rd / ".lock").read_text().strip() == str(holder.pid)
    finally:
        holder.kill()
        holder.wait()


def test_lock_held_by_this_process_refuses_in_the_library(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.create()
    rd.acquire_lock()
    assert (rd.path / ".lock").read_text().splitlines()[0] == str(os.getpid())
    with pytest.raises(RunFolderBusy, match=f"pid {os.getpid()}"):
        run_experiment(cfg(), rd.path)
    rd.release_lock()
    assert not (rd.path / ".lock").exists()


def test_a_stale_lock_is_taken_over_and_removed_at_the_end(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    rd = tmp_path / "run"
    rd.mkdir()
    (rd / ".lock").write_text(f"{gone.pid}\n")
    res = run_experiment(cfg(), rd)
    assert res.summary["status"] == "completed"
    assert not (rd / ".lock").exists()


def test_the_lock_is_removed_when_a_run_fails(tmp_path, monkeypatch):
    def boom(res: ClientResult) -> None:
        raise RuntimeError("client crashed")

    corrupt_round(monkeypatch, 1, boom)
    rd = tmp_path / "run"
    with pytest.raises(RuntimeError):
        run_experiment(cfg(), rd)
    assert not (rd / ".lock").exists()


def test_the_lock_is_held_while_the_run_writes(tmp_path):
    rd = tmp_path / "run"
    held: list[str] = []
    run_experiment(cfg(), rd, on_round=lambda rec: held.append((rd / ".lock").read_text()))
    pids = [text.splitlines()[0] for text in held]  # PID, then the run's token
    assert pids == [str(os.getpid())] * 2 and held[0] == held[1]
    assert not (rd / ".lock").exists()


# -- an unwritable --out -------------------------------------------------------------------


def test_out_under_a_file_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    def no_run(*_args, **_kwargs):
        raise AssertionError("the run started")

    monkeypatch.setattr("fedbug.engine.rounds.Experiment", no_run)
    path = write_yaml(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code = main(["run", str(path), "--out", str(blocker / "runs"), "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert str(blocker / "runs") in err


@pytest.mark.parametrize("command", ["run", "sweep"])
def test_read_only_out_is_refused_before_any_work(tmp_path, capsys, monkeypatch, command):
    def no_run(*_args, **_kwargs):
        raise AssertionError("the run started")

    monkeypatch.setattr("fedbug.engine.rounds.Experiment", no_run)
    path = write_yaml(tmp_path)
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o555)
    try:
        if os.access(out, os.W_OK):  # root writes anyway: simulate a read-only folder
            real = os.access
            monkeypatch.setattr(
                os, "access", lambda p, mode: False if Path(p) == out else real(p, mode)
            )
        code = main([command, str(path), "--out", str(out), "-q"])
    finally:
        out.chmod(0o755)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert str(out) in err and "read-only" in err
    assert list(out.iterdir()) == []


def test_a_personalized_sweep_names_a_diverged_cell_under_table_4(tmp_path, capsys):
    """Personalized cells: a cell whose every seed diverged shows "-" (not a global figure)
    and is named under FedSeq's Table 4, from which its row is absent."""
    grid = {"lr": [0.1, 1e6]}
    path = write_yaml(tmp_path, grid=grid, seeds=1, evaluation="personalized")
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "-q"]) == 4
    text = capsys.readouterr().out
    assert "Diverged, left out: lr=1000000.0 (1 of 1)." in text
    assert "| lr=1000000.0 (1 of 1 diverged) | 1 | - | - |" in text


def test_the_sweeps_plot_leaves_a_diverged_seed_out_of_its_cells_curve(tmp_path, monkeypatch):
    """Seeds at 0.8 and 0.6 and a third that diverged at 0.1: the curve is 70%, the label says
    1 of 3 diverged."""
    import matplotlib.axes
    import matplotlib.pyplot

    from fedbug.report.plain import plot_accuracy
    from fedbug.sweeps.sweep import Cell

    drawn = []
    real = matplotlib.axes.Axes.plot

    def plot(self, x, y, *a, **kw):
        drawn.append((kw.get("label"), list(y)))
        return real(self, x, y, *a, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)

    def run(acc, status="completed"):
        return {"summary": {"status": status}, "records": [{"round": 1, "test_acc": acc}]}

    runs = [run(0.8), run(0.6), run(0.1, "diverged")]
    matplotlib.pyplot.close(plot_accuracy([(Cell({"lr": 0.1}), runs)], ["lr=0.1"], "t"))
    ((label, ys),) = drawn
    assert label.endswith("(1 of 3 diverged)") and ys == pytest.approx([70.0])
