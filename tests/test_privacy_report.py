"""benchmarks/privacy/report.py: the privacy tables from hand-made attack scores and summaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.privacy.report import (
    BEGIN,
    END,
    accuracy_table,
    attack_table,
    into,
    load_accuracy,
    load_attacks,
    main,
)

ATTACK = """\
name: tiny-attack
dataset: digits
model: mlp
num_clients: 4
clients_per_round: 1
rounds: 3
local_steps: 1
weighting: uniform
record_updates: [1, 2]
grid:
  variant:
    - {label: FedAvg, method: fedavg}
    - {label: FedBug, policy: bottom_up, bottom_up.gu_ratio: 0.4}
  steps:
    - {label: 1 step, local_steps: 1}
  privacy:
    - {label: no DP}
    - {label: DP z=1, dp.clip: 0.5, dp.noise_multiplier: 1.0}
seeds: 1
"""

ACCURACY = """\
name: tiny-accuracy
dataset: digits
model: mlp
num_clients: 4
clients_per_round: 2
rounds: 2
weighting: uniform
grid:
  variant:
    - {label: FedAvg, method: fedavg}
  privacy:
    - {label: no DP}
    - {label: DP z=1, dp.noise_multiplier: 1.0}
seeds: 2
"""

FEDAVG, FEDAVG_DP = (
    "method-fedavg_local_steps-1-s0",
    ("method-fedavg_local_steps-1_clip-0.5_noise_multiplier-1.0-s0"),
)
FEDBUG = "policy-bottom_up_gu_ratio-0.4_local_steps-1-s0"


def _write(run: Path, summary: dict, attacks: dict[str, dict]) -> None:
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary))
    for name, scores in attacks.items():
        (run / "attack" / name).mkdir(parents=True)
        (run / "attack" / name / "scores.json").write_text(json.dumps(scores))


def _scored(psnr: float, ssim: float, labels: float, client: object, units=(0, 1, 2)) -> dict:
    return {"client": client, "scored": True, "psnr": psnr, "ssim": ssim,
            "label_recovery": labels, "units_sent": list(units)}  # fmt: skip


@pytest.fixture
def attack_results(tmp_path):
    cfg = tmp_path / "tiny-attack.yaml"
    cfg.write_text(ATTACK)
    sweep = tmp_path / "results" / "tiny-attack-sweep"
    _write(sweep / FEDAVG, {"final": 0.5}, {
        "round-1-client-3-idlg": _scored(100.0, 1.0, 1.0, 3),
        "round-2-client-0-idlg": _scored(20.0, 0.8, 1.0, 0),
        "round-1-released-idlg": _scored(90.0, 0.9, 1.0, "released"),
        "round-2-released-idlg": _scored(30.0, 0.7, 0.0, "released"),
    })  # fmt: skip
    _write(sweep / FEDAVG_DP, {"final": 0.4, "dp": {"epsilon": 2.5}}, {
        "round-1-released-idlg": _scored(6.0, 0.1, 0.0, "released", units=(2,)),
        "round-2-released-refused": {"round": 2, "client": "released", "refused": "no"},
    })  # fmt: skip
    return cfg, tmp_path / "results"


def test_attack_table_means_each_view_and_level_and_counts_refusals(attack_results):
    """FedAvg's server view: PSNR (100 + 20) / 2 = 60.0, SSIM 0.90, labels 100%; released
    without DP (90 + 30) / 2 = 60.0, 0.80, 50%; with DP one scored (6.0, 0.10, 0%), one
    refused; units sent (3 + 3 + 3 + 3 + 1) / 5 = 2.6; FedBug's runs are missing."""
    study = load_attacks(*attack_results)
    assert study.levels == ["no DP", "DP z=1"] and study.noise == {"no DP": 0.0, "DP z=1": 1.0}
    assert study.missing == 2
    lines = attack_table(study).splitlines()
    assert "released, DP z=1 (ε 2.5)" in lines[2] and "released, no DP (ε ∞)" in lines[2]
    cells = [c.strip() for c in lines[4].strip("|").split("|")]
    assert cells == ["1 step", "FedAvg", "2.6", "60.0 / 0.90 / 100", "60.0 / 0.80 / 50",
                     "6.0 / 0.10 / 0 (1 refused)"]  # fmt: skip
    assert lines[-1] == "In progress: 2 runs not finished."


def test_accuracy_table_gives_mean_sd_and_epsilon(tmp_path):
    cfg = tmp_path / "tiny-accuracy.yaml"
    cfg.write_text(ACCURACY)
    sweep = tmp_path / "results" / "tiny-accuracy-sweep"
    for seed, final in ((0, 0.8), (1, 0.6)):
        (sweep / f"method-fedavg-s{seed}").mkdir(parents=True)
        (sweep / f"method-fedavg-s{seed}" / "summary.json").write_text(json.dumps({"final": final}))
    slug = "method-fedavg_noise_multiplier-1.0-s0"
    (sweep / slug).mkdir()
    (sweep / slug / "summary.json").write_text(json.dumps({"final": 0.5, "dp": {"epsilon": 7.25}}))
    gone = {"status": "diverged", "divergence": {"round": 7}, "final": 0.1}  # left out, named
    (sweep / slug.replace("-s0", "-s1")).mkdir()
    (sweep / slug.replace("-s0", "-s1") / "summary.json").write_text(json.dumps(gone))
    acc = load_accuracy(cfg, tmp_path / "results")
    rows = accuracy_table(acc).splitlines()
    no_dp = [c.strip() for c in rows[4].strip("|").split("|")]
    assert no_dp[:4] == ["FedAvg", "global", "no DP", "2/2"]
    assert no_dp[4].startswith("70.00 ± 14.14") and no_dp[5] == "∞"
    dp = [c.strip() for c in rows[5].strip("|").split("|")]
    assert dp[2:] == ["DP z=1", "1/2", "50.00 (1 diverged, in round 7)", "7.25"]
    assert not any("In progress" in r for r in rows)


def test_a_dp_sgd_runs_epsilon_is_its_worst_clients(tmp_path):
    cfg = tmp_path / "tiny-accuracy.yaml"
    cfg.write_text(ACCURACY)
    sweep = tmp_path / "results" / "tiny-accuracy-sweep"
    slug = "method-fedavg_noise_multiplier-1.0-s0"
    (sweep / slug).mkdir(parents=True)
    summary = {"final": 0.5, "dp_sgd": {"epsilon": 6.5, "epsilon_median": 4.0}}
    (sweep / slug / "summary.json").write_text(json.dumps(summary))
    acc = load_accuracy(cfg, tmp_path / "results")
    assert acc.rows[("FedAvg", "DP z=1")][1] == [6.5]
    # the privacy axis first in the grid: the rows still read (method, privacy level)
    lines = ACCURACY.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "variant:")
    end = next(i for i, line in enumerate(lines) if line.strip() == "privacy:")
    stop = next(
        (i for i in range(end + 1, len(lines)) if not lines[i].startswith("    ")), len(lines)
    )
    swapped = lines[:start] + lines[end:stop] + lines[start:end] + lines[stop:]
    cfg.write_text("\n".join(swapped) + "\n")
    assert ("FedAvg", "DP z=1") in load_accuracy(cfg, tmp_path / "results").rows


def test_the_block_in_results_md_is_replaced_and_dated(tmp_path):
    md = tmp_path / "RESULTS.md"
    md.write_text(
        f"# R\n{BEGIN}\nintro\n<!-- tables -->\nState on old.\n\nold table\n{END}\nrest\n"
    )
    into(md, "new table\n")
    text = md.read_text()
    assert "old table" not in text and "new table" in text and "intro" in text
    assert text.count("State on ") == 1 and text.endswith(f"{END}\nrest\n")


@pytest.mark.slow  # matplotlib: seconds on a busy machine
def test_main_writes_the_table_and_the_picture(attack_results, tmp_path, capsys):
    cfg, results = attack_results
    main(["--attack", str(cfg), "--results", str(results), "--out", str(tmp_path / "out")])
    assert (tmp_path / "out" / "privacy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "60.0 / 0.90 / 100" in (tmp_path / "out" / "privacy.md").read_text()


def test_a_multi_step_updates_two_inverting_gradients_attacks_are_rows_of_their_own(tmp_path):
    cfg = tmp_path / "tiny-attack.yaml"
    cfg.write_text(ATTACK)
    sweep = tmp_path / "results" / "tiny-attack-sweep"
    _write(sweep / FEDAVG, {"final": 0.5}, {
        "round-1-client-3-ig": {**_scored(15.0, 0.3, 0.8, 3), "method": "ig"},
        "round-1-client-3-ig-unrolled": {**_scored(21.0, 0.6, 1.0, 3), "method": "ig-unrolled"},
        "round-1-client-3-ig-unrolled-known-order": {
            **_scored(30.0, 0.9, 1.0, 3), "method": "ig-unrolled", "known_order": True},
    })  # fmt: skip
    rows = [line.split("|")[1:5] for line in attack_table(load_attacks(cfg, tmp_path / "results"))
            .splitlines() if line.startswith("| 1 step")]  # fmt: skip
    assert [[c.strip() for c in r] for r in rows] == [
        ["1 step, IG, one gradient", "FedAvg", "3.0", "15.0 / 0.30 / 80"],
        ["1 step, IG, unrolled", "FedAvg", "3.0", "21.0 / 0.60 / 100"],
        ["1 step, IG, unrolled, known order", "FedAvg", "3.0", "30.0 / 0.90 / 100"],
    ]
