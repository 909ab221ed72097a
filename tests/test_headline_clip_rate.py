"""benchmarks/headline/clip_rate.py: it runs the headline sweep's own cell config, and counts
clipped steps: every step when the clip is far below any gradient's norm, none when far above;
FedDyn's second count (the authors' order) follows the same rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny import tiny_config

from benchmarks.headline import clip_rate
from fedbug.config import load_config

RUN = Path(clip_rate.__file__).parent / "results" / "fedbug-headline-sweep"


def test_the_cell_is_the_sweeps_run_but_for_rounds_and_evaluation():
    cfg = clip_rate.cell_config("dirichlet", "feddyn", "FedBug 40%", 1, 20, "loss")
    swept = load_config(
        RUN / "partition-dirichlet_algorithm-feddyn_policy-bottom_up_gu_ratio-0.4-s1/config.yaml"
    )
    ours, theirs = cfg.model_dump(), swept.model_dump()
    assert (ours.pop("rounds"), ours.pop("eval_every")) == (20, 21)
    assert ours["feddyn"].pop("clip") == "loss" and theirs["feddyn"].pop("clip") == "all"
    del theirs["rounds"], theirs["eval_every"]
    assert ours == theirs
    with pytest.raises(SystemExit, match="no cell"):
        clip_rate.cell_config("dirichlet", "feddyn", "FedBug 50%", 0, 20)


@pytest.mark.parametrize("algorithm", ["fedavg", "feddyn"])
@pytest.mark.parametrize(("clip", "all_clipped"), [(1e-6, True), (1e6, False)])
def test_clipped_steps_are_counted(algorithm, clip, all_clipped):
    cfg = tiny_config(algorithm=algorithm, clip_grad_norm=clip, rounds=3)
    out = clip_rate.measure(cfg, bucket=2)
    rows = out["buckets"]
    assert [r["rounds"] for r in rows] == ["1-2", "3-4"]
    assert [r["steps"] for r in rows] == [2 * 3 * 3, 3 * 3]  # rounds x clients x local steps
    for r in rows:
        assert r["clipped"] == (r["steps"] if all_clipped else 0)
        assert r["max_norm"] > 0
        if algorithm == "feddyn":
            assert r["clipped_loss"] == r["clipped"]
            assert r["max_norm_loss"] != r["max_norm"]  # alpha_i theta left out
