"""A run kept as its ``family.json`` (benchmarks/family/report.py ``--extract``: the summary
less its per-client tables) is checked against its folder as a summary.json is
(:func:`fedbug.engine.run_folder.folder_disagreement`): an extract of another config or seed,
checksum and all, is an error naming family.json, not that run's figures under this cell."""

import json
import shutil

import pytest
from tiny import tiny_config

import fedbug
from benchmarks.family.report import EXTRACT, read_run, write_extract
from fedbug.errors import ResultsError
from fedbug.report.thin import main as thin
from fedbug.results import RunDir, with_crc


def kept_as_committed(path, **changes) -> RunDir:
    """A tiny run of 4 rounds as the family benchmark commits one without its summary:
    config.yaml, family.json and the thinned curve."""
    fedbug.run(tiny_config(rounds=4, eval_every=2, count_flops=False, threads=1, **changes), path)
    rd = RunDir(path)
    assert thin([str(path), "--every", "2"]) == 0
    write_extract(rd)
    rd.summary_path.unlink()
    rd.metrics_path.unlink()
    return rd


def test_an_extract_of_another_config_or_seed_is_refused_naming_family_json(tmp_path):
    rd = kept_as_committed(tmp_path / "run")
    assert read_run(rd)["summary"]["rounds"] == 4  # its own extract reads
    mine = json.loads((rd.path / EXTRACT).read_text())

    other = kept_as_committed(tmp_path / "other", lr=0.05)  # same rounds, another config
    shutil.copy(other.path / EXTRACT, rd.path / EXTRACT)
    with pytest.raises(ResultsError) as e:
        read_run(rd)
    message = str(e.value)
    assert "\n" not in message and str(rd.path / EXTRACT) in message
    assert "config hash" in message and "in family.json where config.yaml's is" in message
    assert "--extract" in message  # the way out

    seed = {k: v for k, v in mine.items() if k != "crc"}
    seed.update(seed=1, config={**mine["config"], "seed": 1})  # checksummed again
    (rd.path / EXTRACT).write_text(json.dumps(with_crc(seed)))
    with pytest.raises(ResultsError, match="seed 1 in family.json where config.yaml says seed 0"):
        read_run(rd)
