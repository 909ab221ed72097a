"""benchmarks/privacy/run.py: the smoke cut of a sweep; which attacks a finished run calls for."""

from __future__ import annotations

import json
from types import SimpleNamespace

from benchmarks.privacy.run import ITERATIONS, jobs_of, smoke_doc


def test_smoke_keeps_each_axis_first_entry_and_the_privacy_extremes():
    doc = {"name": "s", "seeds": 3, "record_updates": [3, 4, 5], "rounds": 5, "grid": {
        "variant": [{"label": "A"}, {"label": "B"}],
        "privacy": [{"label": "no DP"}, {"label": "z=0.1"}, {"label": "z=1"}],
    }}  # fmt: skip
    out = smoke_doc(doc)
    assert out["name"] == "s-smoke" and out["seeds"] == 1 and out["rounds"] == 5
    assert out["grid"] == {"variant": [{"label": "A"}], "privacy": [{"label": "no DP"},
                                                                  {"label": "z=1"}]}  # fmt: skip
    assert doc["grid"]["variant"] == [{"label": "A"}, {"label": "B"}]  # not changed
    plain = smoke_doc({"name": "a", "rounds": 40})
    assert (plain["rounds"], plain["subsample"]) == (2, 0.05)


def _recorded(run, rounds, steps=1):
    for r, client in rounds.items():
        d = run / "updates" / f"round-{r}"
        d.mkdir(parents=True)
        (d / f"client-{client}.json").write_text(json.dumps({"steps": steps}))


def test_each_round_with_its_next_recorded_is_attacked_as_server_and_release(tmp_path):
    """Rounds 3, 4, 5 recorded: 3 and 4 have their release (the next round's weights); without
    DP both views, with DP the release only; an attack already scored is not run again."""
    run = tmp_path / "run"
    _recorded(run, {3: 7, 4: 2, 5: 9})
    jobs = jobs_of(run, SimpleNamespace(dp=None), ITERATIONS)
    assert [(j.round, j.who) for j in jobs] == [(3, "client"), (3, "released"), (4, "client"),
                                                (4, "released")]  # fmt: skip
    done = run / "attack" / "round-4-client-2-idlg"
    done.mkdir(parents=True)
    (done / "scores.json").write_text(json.dumps({"psnr": 1.0}))
    jobs = jobs_of(run, SimpleNamespace(dp=object()), ITERATIONS)
    assert [(j.round, j.who) for j in jobs] == [(3, "released"), (4, "released")]
    jobs = jobs_of(run, SimpleNamespace(dp=None), ITERATIONS)
    assert (4, "client") not in [(j.round, j.who) for j in jobs]


def test_an_update_of_several_steps_is_attacked_as_one_gradient_and_unrolled(tmp_path):
    run = tmp_path / "run"
    _recorded(run, {3: 7, 4: 2}, steps=6)
    jobs = jobs_of(run, SimpleNamespace(dp=object()), ITERATIONS)
    got = [(j.round, j.who, j.method) for j in jobs]
    assert got == [(3, "released", "ig"), (3, "released", "ig-unrolled")]
    # without DP the client's own update too, and unrolled in its known order (upper bound)
    jobs = jobs_of(run, SimpleNamespace(dp=None), ITERATIONS)
    client = [j.method for j in jobs if j.round == 3 and j.who == "client"]
    assert client == ["ig", "ig-unrolled", "ig-unrolled-known-order"]
    done = run / "attack" / "round-3-released-ig"
    done.mkdir(parents=True)
    (done / "scores.json").write_text(json.dumps({"psnr": 1.0}))
    jobs = jobs_of(run, SimpleNamespace(dp=object()), ITERATIONS)
    assert [(j.round, j.who, j.method) for j in jobs] == [(3, "released", "ig-unrolled")]
