"""``fedbug report`` counts a run once per config hash and seed: a standalone run and a sweep's
cell of the same config and seed under one folder are one seed, not two, and the report says
how many duplicates it ignored (one line under the table)."""

from __future__ import annotations

from pathlib import Path

from fedbug.cli import main
from fedbug.sweeps.sweep import collect_runs, report

CONFIG = """\
dataset: digits
model: mlp
num_clients: 6
clients_per_round: 3
rounds: 2
local_steps: 3
batch_size: 16
eval_batch_size: 256
count_flops: false
"""


def test_a_run_and_a_sweep_cell_of_one_config_and_seed_count_once(tmp_path, capsys):
    cfg = tmp_path / "pool.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    runs = tmp_path / "runs"
    assert main(["run", str(cfg), "--out", str(runs), "-q"]) == 0  # seed 0, standalone
    assert main(["run", str(cfg), "-s", "seed=1", "--out", str(runs), "-q"]) == 0
    assert main(["sweep", str(cfg), "--seeds", "2", "--out", str(runs), "-q"]) == 0  # 0 and 1
    capsys.readouterr()
    found = collect_runs([runs])
    assert len(found) == 2 and len(found.duplicates) == 2
    assert sorted(r["summary"]["seed"] for r in found) == [0, 1]
    (row,) = report([runs])
    assert sorted(row["seeds"]) == [0, 1]  # before: [0, 0, 1, 1], each seed counted twice
    assert main(["report", str(runs)]) == 0
    out = capsys.readouterr().out.splitlines()
    (line,) = [x for x in out if x.startswith("ignored: ")]
    assert line.startswith("ignored: 2 duplicate run(s)"), line
    sweep = runs / "pool-sweep"
    assert all(str(sweep / f"base-s{s}") in line for s in (0, 1)), line
    (table_row,) = [x for x in out if x.startswith("| fedavg |")]  # one group: seeds pooled
    assert table_row.split("|")[2].strip() == "2", table_row  # the seeds column


def test_a_folder_given_twice_counts_once(tmp_path, capsys):
    cfg = tmp_path / "pool.yaml"
    cfg.write_text(CONFIG, encoding="utf-8")
    runs = tmp_path / "runs"
    assert main(["run", str(cfg), "--out", str(runs), "-q"]) == 0
    (run_dir,) = [p for p in runs.iterdir() if p.is_dir()]
    found = collect_runs([runs, Path(run_dir)])
    assert len(found) == 1 and not found.duplicates and not found.damaged


def test_a_run_that_differs_in_an_unhashed_key_pools_into_its_sweep_cell(tmp_path, capsys):
    """``record_updates`` is left out of the config hash (what a run writes, not its numbers):
    a recorded run of a sweep cell's config and seed is that cell's run, so the report neither
    drops the cell's own run as its duplicate nor shows the recorded run as a row of its own."""
    cfg = tmp_path / "pool.yaml"
    grid = "grid:\n  variant:\n    - {label: A, lr: 0.05}\n    - {label: B, lr: 0.1}\n"
    cfg.write_text(CONFIG + grid, encoding="utf-8")
    runs = tmp_path / "runs"
    assert main(["sweep", str(cfg), "--seeds", "2", "--out", str(runs), "-q"]) == 0
    recorded = ["-s", "lr=0.1", "-s", "record_updates=[1]", "-s", "grid=null"]
    assert main(["run", str(cfg), *recorded, "--out", str(runs), "-q"]) == 0  # B's seed 0
    capsys.readouterr()
    found = collect_runs([runs])
    assert len(found) == 4 and len(found.duplicates) == 1
    rows = report([runs])
    got = [(r["label"], sorted(r["seeds"])) for r in rows]
    assert got == [("A (lr=0.05)", [0, 1]), ("B (lr=0.1)", [0, 1])]  # B: the recorded run's s0
