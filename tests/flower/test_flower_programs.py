"""The Flower programs a launch starts (``flower-superlink``, ``flwr``, and what the SuperLink
starts in turn) are looked up before anything is written: on ``PATH``, else beside this Python
(a virtualenv's ``bin`` that is not on ``PATH``); one missing is one message, exit 2, and no run
folder. No Flower process starts here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("flwr")

from tiny import TINY_DOC  # noqa: E402

from fedbug.cli import main  # noqa: E402
from fedbug.errors import ConfigError  # noqa: E402
from fedbug.integrations.flower.launch import PROGRAMS, check_programs, flower_env  # noqa: E402


def _bin(folder: Path, names: tuple[str, ...]) -> Path:
    """``folder`` holding an executable file (that nothing runs) for each of ``names``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_text("#!/bin/sh\nexit 1\n")
        (folder / name).chmod(0o755)
    return folder


@pytest.mark.parametrize(
    ("executor", "missing"),
    [
        ("flower-simulation", "programs flower-superlink, flwr, flower-superexec, flwr-simulation"),
        ("flower-deployment", "program flwr"),
    ],
)
def test_a_missing_flower_program_is_one_line_exit_2_and_no_run_folder(
    tmp_path, monkeypatch, capsys, executor, missing
):
    empty = _bin(tmp_path / "path", ())
    python = _bin(tmp_path / "venv" / "bin", ())  # an interpreter's folder without Flower
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(sys, "executable", str(python / "python"))
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(TINY_DOC))
    out = tmp_path / "out"
    argv = ["run", str(cfg), "-s", f"executor={executor}", "--out", str(out)]
    assert main([*argv, "-s", "flower.superlink=127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"fedbug: error: executor {executor} needs the {missing},")
    assert f"not found on PATH or beside this Python ({python})" in err
    assert 'pip install "fedbug[flower]"' in err and "virtualenv" in err
    assert not out.exists() or not any(out.iterdir())


def test_programs_beside_this_python_are_found_when_path_lacks_them(tmp_path, monkeypatch):
    names = PROGRAMS["flower-simulation"]
    on_path = _bin(tmp_path / "path", ("flwr",))  # the PATH's own flwr comes first
    python = _bin(tmp_path / "venv" / "bin", names)
    monkeypatch.setenv("PATH", str(on_path))
    monkeypatch.setattr(sys, "executable", str(python / "python"))
    env = flower_env(tmp_path / "home")
    assert env["PATH"] == os.pathsep.join([str(on_path), str(python)])
    found = check_programs("flower-simulation", env["PATH"])
    assert found == {n: str((on_path if n == "flwr" else python) / n) for n in names}


def test_the_interpreters_folder_is_not_added_twice(tmp_path, monkeypatch):
    python = _bin(tmp_path / "venv" / "bin", PROGRAMS["flower-deployment"])
    monkeypatch.setenv("PATH", str(python))
    monkeypatch.setattr(sys, "executable", str(python / "python"))
    env = flower_env(tmp_path / "home")
    assert env["PATH"] == str(python)
    assert check_programs("flower-deployment", env["PATH"]) == {"flwr": str(python / "flwr")}


def test_check_programs_names_every_missing_one(tmp_path, monkeypatch):
    python = _bin(tmp_path / "venv" / "bin", ("flwr",))
    monkeypatch.setenv("PATH", str(_bin(tmp_path / "path", ())))
    monkeypatch.setattr(sys, "executable", str(python / "python"))
    with pytest.raises(ConfigError) as e:
        check_programs("flower-simulation")
    text = str(e.value)
    assert "needs the programs flower-superlink, flower-superexec, flwr-simulation," in text
    assert "\n" not in text


def test_an_empty_path_entry_is_left_out_and_no_interpreter_is_not_named(tmp_path, monkeypatch):
    """The current folder (an empty PATH entry) never serves a program: a received run folder
    may hold one; without an interpreter's path the refusal names PATH alone."""
    monkeypatch.chdir(_bin(tmp_path / "received", PROGRAMS["flower-deployment"]))
    monkeypatch.setenv("PATH", os.pathsep + str(_bin(tmp_path / "path", ())))
    monkeypatch.setattr(sys, "executable", "")
    env = flower_env(tmp_path / "home")
    assert env["PATH"] == str(tmp_path / "path")
    with pytest.raises(ConfigError) as exc:
        check_programs("flower-deployment", env["PATH"])
    assert "not found on PATH;" in str(exc.value) and "()" not in str(exc.value)
