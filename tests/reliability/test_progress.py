"""Issue 31 item 2, progress everywhere: off a terminal (stdout to a file or a pipe) ``fedbug
run`` writes a plain line per round as it goes, not rich bars shown once the run is over; the
steps after the rounds (each client evaluated, then fine-tuned, under personalized evaluation;
the summary and plots written) say what they do and how far they are, on a terminal and off it;
the printed run time covers the whole command, fine-tuning included; ``-q`` silences it all."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
import yaml
from tiny import TINY_DOC

from fedbug.cli import main
from fedbug.engine.pfl import PersonalizedEvaluator

ROUND = re.compile(r"tiny seed 0: round (\d+)/3(, acc \d+\.\d%)?, \d+\.\d s")
FINETUNING = re.compile(r"tinyp seed 0: fine-tuning each client (\d+)/4, \d+\.\d s")
TIME = re.compile(r"after 2 rounds \((\d+\.\d) s, the rounds (\d+\.\d) s\)")


@pytest.fixture(autouse=True)
def fast(stub_plot, monkeypatch: pytest.MonkeyPatch) -> None:
    """No per-run plots (most of a tiny run's time)."""
    stub_plot("plot_run")
    monkeypatch.setattr("fedbug.engine.evaluation.plot_clients", lambda *a, **k: None)


def config(tmp_path: Path, name: str, **extra: object) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**TINY_DOC, "name": name, **extra}), encoding="utf-8")
    return path


def personalized(tmp_path: Path) -> Path:
    return config(tmp_path, "tinyp", evaluation="personalized", finetune_epochs=1, local_steps=1)


def test_off_a_terminal_each_round_is_a_plain_line(tmp_path, capsys):
    cfg = config(tmp_path, "tiny", rounds=3, eval_every=2)
    assert main(["run", str(cfg), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "━" not in out  # no ANSI escapes, no bar
    rounds = [m for line in out.splitlines() if (m := ROUND.fullmatch(line))]
    assert [int(m[1]) for m in rounds] == [1, 2, 3]
    assert [m[2] is not None for m in rounds] == [False, True, True]  # evaluated: 2 and the last
    lines = out.splitlines()
    (writing,) = [i for i, x in enumerate(lines) if x.startswith("tiny seed 0: writing summary")]
    (final,) = [i for i, x in enumerate(lines) if x.startswith("final test accuracy")]
    assert lines.index(rounds[-1][0]) < writing < final


def test_the_final_line_of_one_round_says_round(tmp_path, capsys):
    cfg = config(tmp_path, "tiny", rounds=1)
    assert main(["run", str(cfg), "--out", str(tmp_path / "out"), "-q"]) == 0
    (final,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("final ")]
    assert " after 1 round (" in final, final


def test_fine_tuning_says_how_far_it_is_and_the_time_covers_it(tmp_path, capsys, monkeypatch):
    finetune = PersonalizedEvaluator.finetune

    def slow(self, *args, **kwargs):  # fine-tuning that takes a while, as on a busy machine
        time.sleep(1.2)
        return finetune(self, *args, **kwargs)

    monkeypatch.setattr(PersonalizedEvaluator, "finetune", slow)
    assert main(["run", str(personalized(tmp_path)), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    done = [int(m[1]) for line in lines if (m := FINETUNING.fullmatch(line))]
    assert done[0] == 0 and done[-1] == 4 and done == sorted(done)
    for step in ("evaluating each client 4/4", "writing clients.csv and clients.png"):
        assert any(line.startswith(f"tinyp seed 0: {step}, ") for line in lines), step
    (times,) = [m for line in lines if (m := TIME.search(line))]
    took, rounds = float(times[1]), float(times[2])
    assert took - rounds >= 1.2  # the fine-tuning is in the printed time, not in the rounds'


def test_on_a_terminal_fine_tuning_has_its_own_bar(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("fedbug.cli.progress.is_terminal", lambda stream=None: True, raising=False)
    assert main(["run", str(personalized(tmp_path)), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"tinyp seed 0 .* 2/2 acc", out)  # the rounds' bar
    assert re.search(r"fine-tuning each client .* 4/4", out)
    assert not FINETUNING.search(out)  # bars, not lines


def test_quiet_silences_rounds_and_steps(tmp_path, capsys):
    assert main(["run", str(personalized(tmp_path)), "--out", str(tmp_path / "out"), "-q"]) == 0
    out = capsys.readouterr().out
    assert "round 1/2" not in out and "fine-tuning each client" not in out
    assert "final client mean accuracy" in out


def test_a_reader_gone_midway_leaves_the_run_to_finish(tmp_path, monkeypatch):
    """``fedbug run ... | head -1``: the lines written as the run goes must not stop it when the
    reader closes the pipe after the first; the run ends complete, its lines going nowhere."""
    fd = os.open(tmp_path / "sink", os.O_WRONLY | os.O_CREAT)

    class GoneReader(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            return fd

    monkeypatch.setattr(sys, "stdout", GoneReader())
    try:
        rc = main(["run", str(config(tmp_path, "tiny", rounds=3)), "--out", str(tmp_path / "out")])
    finally:
        os.close(fd)
    assert rc in (0, 141)  # 141: the result lines after the run met the closed pipe
    (summary,) = (tmp_path / "out").glob("tiny-s0-*/summary.json")
    assert json.loads(summary.read_text())["status"] == "completed"
