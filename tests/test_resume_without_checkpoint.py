"""`resume` with nothing to resume: a new run, said in a warning (a run killed before its first
checkpoint resumes from round 1 silently, as the crash drill expects); a finished run kept
without its checkpoint is refused, never wiped (committed benchmark results keep their
metrics)."""

import pytest
from tiny import tiny_config

from fedbug.engine import run_experiment
from fedbug.errors import CheckpointError


def test_resume_in_an_empty_folder_starts_a_new_run_and_says_so(tmp_path):
    with pytest.warns(UserWarning, match="nothing to resume.*starting a new run"):
        res = run_experiment(tiny_config(rounds=1), tmp_path / "r", resume=True)
    assert [r["round"] for r in res.records] == [1]


def test_resume_of_a_finished_run_without_its_checkpoint_is_refused_and_keeps_it(tmp_path):
    run_experiment(tiny_config(rounds=2), tmp_path / "r")
    (tmp_path / "r" / "checkpoint.pt").unlink()
    metrics = (tmp_path / "r" / "metrics.jsonl").read_bytes()
    with pytest.raises(CheckpointError, match="finished run but no checkpoint"):
        run_experiment(tiny_config(rounds=2), tmp_path / "r", resume=True)
    assert (tmp_path / "r" / "metrics.jsonl").read_bytes() == metrics
