"""A ``cohort:`` block set in a config run with another executor is read by nothing: one
one-line warning says so (not a refusal: a sweep over executors shares one block), and a block
at its defaults (as a resolved config.yaml lists it) says nothing."""

from __future__ import annotations

import yaml
from tiny import TINY_DOC

from fedbug.cli import main
from fedbug.config import load_config
from fedbug.config.cohort import unused_cohort_block

WARNING = (
    "fedbug: warning: cohort: is read only by executor: cohort; this run's executor, "
    "sequential, ignores it (remove the block, or set executor: cohort)"
)


def test_the_block_is_unused_only_when_set_off_its_defaults_under_another_executor():
    set_ = {**TINY_DOC, "cohort": {"max_clients": 3}}
    assert unused_cohort_block(load_config(None, doc=dict(set_))) == WARNING.split(": ", 2)[2]
    assert unused_cohort_block(load_config(None, doc={**set_, "executor": "cohort"})) is None
    defaults = {**TINY_DOC, "cohort": {"max_clients": None, "memory_mb": None}}
    assert unused_cohort_block(load_config(None, doc=defaults)) is None
    assert unused_cohort_block(load_config(None, doc=dict(TINY_DOC))) is None


def command(tmp_path, capsys, verb: str, *argv: str) -> tuple[int, list[str]]:
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(yaml.safe_dump(TINY_DOC, sort_keys=False), encoding="utf-8")
    rc = main([verb, str(cfg), "--out", str(tmp_path / "out"), "-q", *argv])
    return rc, capsys.readouterr().err.splitlines()


def test_run_with_a_cohort_option_under_sequential_warns_once(tmp_path, capsys, no_plots):
    rc, err = command(tmp_path, capsys, "run", "-s", "cohort.max_clients=3")
    assert rc == 0 and err == [WARNING]
    (tmp_path / "b").mkdir()
    rc, err = command(tmp_path / "b", capsys, "run", "-s", "cohort.max_clients=null")
    assert rc == 0 and err == []


def test_a_sweep_warns_once_where_no_cell_runs_the_cohort_executor(tmp_path, capsys, no_plots):
    grid = ("-g", "lr=0.1,0.2", "--seeds", "2")  # four sequential runs
    rc, err = command(tmp_path, capsys, "sweep", "-s", "cohort.max_clients=1", *grid)
    assert rc == 0 and err == [WARNING]


def test_a_sweep_over_executors_sharing_the_block_runs_without_a_word(tmp_path, capsys, no_plots):
    grid = ("-g", "executor=sequential,cohort", "--seeds", "2")
    rc, err = command(tmp_path, capsys, "sweep", "-s", "cohort.max_clients=1", *grid)
    assert rc == 0 and err == []
