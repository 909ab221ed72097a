"""Client-level differential privacy (DP-FedAvg with fixed or adaptive clipping): the clip, the
server's noise, the accountant, the adaptive clip, resume and the refusals."""

import json
import math
import sys

import pytest
import torch
from tiny import method_needs, tiny_config, without_timing

from fedbug.cli import main
from fedbug.config.dp import AdaptiveClip
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine import run_experiment
from fedbug.engine.privacy.client_level import DPAggregate, ServerDP, adapt_clip, clip_update
from fedbug.errors import ConfigError

DP = {"clip": 1.0, "noise_multiplier": 1.0, "delta": 1e-5}


def space_of(*sizes):
    """A flat space of units of the given sizes (a Linear per unit, weight only)."""
    model = torch.nn.Sequential(*[torch.nn.Linear(n, 1, bias=False) for n in sizes])
    return ParamSpace(model, find_units(model, names=[str(i) for i in range(len(sizes))]))


def test_update_of_norm_3_is_clipped_to_norm_1():
    delta = torch.tensor([2.0, 1.0, 2.0, 5.0])  # norm 3 over the first three entries
    sent = torch.tensor([True, True, True, False])  # the last unit was not sent
    clipped, norm = clip_update(delta, sent, 1.0)
    assert norm == pytest.approx(3.0)
    assert torch.allclose(clipped, torch.tensor([2 / 3, 1 / 3, 2 / 3, 0.0]))
    small, _ = clip_update(torch.tensor([0.3, 0.4, 0.0, 0.0]), sent, 1.0)  # norm 0.5: kept
    assert torch.equal(small, torch.tensor([0.3, 0.4, 0.0, 0.0]))


def test_aggregate_clips_over_sent_units_and_divides_by_expected_clients():
    space = space_of(2, 2)
    agg = DPAggregate(space, clip=1.0, expected=4.0)
    agg.add(torch.tensor([3.0, 4.0, 9.0, 9.0]), [True, False], 10)  # norm 5 -> [0.6, 0.8]
    agg.add(torch.tensor([0.0, 0.5, 0.0, 0.0]), [True, False], 99)  # uniform: 99 samples weigh 1
    agg.release(0.0, torch.Generator().manual_seed(0))
    # (0.6 + 0, 0.8 + 0.5) / 4 on the sent unit; the unsent unit keeps its value
    assert torch.allclose(agg.mean_delta(), torch.tensor([0.15, 0.325, 0.0, 0.0]))
    assert agg.norms == pytest.approx([5.0, 0.5])


def test_server_noise_has_the_configured_std():
    """z = 1.5, C = 2: the noise on a zero aggregate has std z C = 3 (200,000 draws, seed 0:
    the sample std's own std is 3 / sqrt(2 n) = 0.005, so within 1% is 6 of those)."""
    space = space_of(100_000, 100_000)
    agg = DPAggregate(space, clip=2.0, expected=1.0)
    agg.add(torch.zeros(space.total), [True, True], 1)
    agg.release(1.5 * 2.0, torch.Generator().manual_seed(0))
    noise = agg.delta_sum()
    assert abs(float(noise.std()) - 3.0) < 0.03
    assert abs(float(noise.mean())) < 0.03


def test_accountant_matches_tf_privacy_published_epsilon():
    """TF Privacy's classification tutorial (tensorflow.org/responsible_ai/privacy/tutorials/
    classification_privacy): sampling rate 250/60000, noise multiplier 1.3, 3600 steps satisfy
    (1.18, 1e-5)-DP by the RDP accountant with the classic conversion eps = min_a (RDP(a) -
    log(delta) / (a - 1)); dp-accounting's get_epsilon uses the tighter conversion of Canonne et
    al. 2020, so ours is lower (0.94)."""
    dpa = pytest.importorskip("dp_accounting")
    cfg = tiny_config(
        num_clients=60000,
        clients_per_round=None,
        participation=250 / 60000,
        dp=DP | {"noise_multiplier": 1.3},
        weighting="uniform",
    )
    acc = ServerDP(cfg, space_of(1)).accountant
    acc.spend(3600)
    orders = [1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5, *range(5, 64), 128, 256, 512]
    rdp = dpa.rdp.RdpAccountant(orders)
    rdp.compose(acc.event(), 3600)
    classic = min(r - math.log(1e-5) / (a - 1) for r, a in zip(rdp._rdp, orders))
    assert classic == pytest.approx(1.18, abs=0.005)
    assert acc.epsilon() == pytest.approx(0.942, abs=0.001)


def test_adaptive_clip_moves_toward_the_target_quantile():
    """Norms 1..10, target median: from C = 2 (2 of 10 unclipped, b = 0.2 < 0.5) the clip grows
    by exp(0.2 * 0.3); from C = 9 (b = 0.9) it shrinks; iterated it settles between 5 and 6."""
    norms = [float(n) for n in range(1, 11)]

    def step(c):
        return adapt_clip(c, sum(n <= c for n in norms) / len(norms), 0.5, 0.2)

    assert step(2.0) == pytest.approx(2.0 * math.exp(0.06))
    assert step(9.0) < 9.0
    c = 2.0
    for _ in range(200):
        c = step(c)
    assert 4.5 < c < 6.5


def dp_config(**over):
    doc = dict(weighting="uniform", dp=DP, rounds=3, checkpoint_every=1, count_flops=False)
    doc.update(over)
    return tiny_config(**doc)


def test_dp_run_records_epsilon_and_resumes_bitwise(tmp_path):
    pytest.importorskip("dp_accounting")
    cfg = dp_config(dp=DP | {"adaptive": {"target_quantile": 0.5, "count_noise": 1.0}})
    full = run_experiment(cfg, tmp_path / "full")
    run_experiment(cfg, tmp_path / "cut", stop_after=2)
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)
    assert torch.equal(resumed.weights, full.weights)
    eps = [r["dp_epsilon"] for r in full.records]
    assert 0 < eps[0] < eps[1] < eps[2]
    clips = [r["dp_clip"] for r in full.records]
    assert clips[0] == 1.0 and clips[1] != 1.0  # adaptive
    assert all(0.0 <= r["dp_clipped_fraction"] <= 1.0 for r in full.records)
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert summary["dp"]["epsilon"] == eps[2]
    assert summary["dp"]["delta"] == 1e-5


def test_noise_changes_the_model_and_no_noise_only_clips(tmp_path):
    pytest.importorskip("dp_accounting")
    plain = run_experiment(dp_config(dp=None, rounds=1))
    clip_only = run_experiment(dp_config(dp=DP | {"clip": 1e6, "noise_multiplier": 0.0}, rounds=1))
    # a clip no update reaches and no noise: the plain uniform mean times k / m = 1
    assert torch.allclose(plain.weights, clip_only.weights, atol=1e-6)
    assert clip_only.records[0]["dp_epsilon"] is None  # no noise: no privacy
    noised = run_experiment(dp_config(rounds=1))
    assert not torch.allclose(plain.weights, noised.weights, atol=1e-3)


def test_a_frozen_unit_gets_no_noise_and_keeps_its_value():
    """policy fixed_head: the head is never sent, so it is neither clipped nor noised."""
    pytest.importorskip("dp_accounting")
    cfg = dp_config(policy="fixed_head", rounds=1, dp=DP | {"noise_multiplier": 5.0})
    start = run_experiment(dp_config(policy="fixed_head", rounds=1, dp=None))  # head unsent too
    res = run_experiment(cfg)
    n_head = 32 * 10 + 10  # the mlp's classifier, Linear(32, 10)
    assert torch.equal(res.weights[-n_head:], start.weights[-n_head:])
    assert not torch.allclose(res.weights[:-n_head], start.weights[:-n_head], atol=1e-3)


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"dp": DP | {"noise_multiplier": -1.0}}, "noise_multiplier=-1.0 is negative"),
        ({"dp": DP | {"delta": 1.0}}, r"delta=1.0 is not in \(0, 1\)"),
        ({"dp": DP | {"delta": 0.0}}, r"delta=0.0 is not in \(0, 1\)"),
        ({"algorithm": "scaffold"}, "also sends extra tensors"),
        ({"algorithm": "fedexp"}, "fedexp's step size reads the sum of the clients' squared"),
        ({"weighting": "samples"}, "set weighting: uniform"),
        ({"selection": "reputation"}, "selection bernoulli or uniform"),
        (
            {"dp": DP | {"noise_multiplier": 1.0, "adaptive": {"count_noise": 0.4}}},
            "needs count_noise > z/2",
        ),
    ],
)
def test_refusals(over, message):
    with pytest.raises(ConfigError, match=message):
        dp_config(**over)


@pytest.mark.parametrize(
    "over",
    [
        {"algorithm": "slt", **method_needs("slt")},
        {"fedrolex": {"bn_linear_weights": "code_counts"}},
    ],
)
def test_extras_sent_by_a_session_are_refused_by_the_config(over):
    """SLT's sessions send their stage, FedRoLex's under code_counts pieces of the update, as
    extras: each declares it (``sends_extras``), so the config is refused before any data loads
    (it used to be refused by the DP aggregate in round 1); FedRoLex's default sends one delta
    and is accepted."""
    over = {"algorithm": "fedrolex", **method_needs("fedrolex"), **over}
    with pytest.raises(ConfigError, match=r"also sends extra tensors beside it the server"):
        dp_config(rounds=1, **over)
    dp_config(rounds=1, algorithm="fedrolex")


def test_refusal_exits_2_from_the_cli(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("dp: {clip: 1.0, noise_multiplier: -1.0}\nweighting: uniform\n")
    rc = main(["run", str(cfg), "--out", str(tmp_path / "o"), "-q"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "noise_multiplier=-1.0 is negative" in err


def test_adaptive_defaults_follow_the_paper():
    ad = AdaptiveClip()
    assert (ad.target_quantile, ad.lr, ad.count_noise) == (0.5, 0.2, None)


def test_missing_dp_accounting_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # import fails as when not installed
    with pytest.raises(ConfigError, match=r'pip install "fedbug\[dp\]"'):
        run_experiment(dp_config(rounds=1))


def test_a_run_diverged_under_dp_names_the_noise_not_the_learning_rate():
    from fedbug.engine.checks import divergence_hint

    hint = divergence_hint(dp_config(dp=DP | {"noise_multiplier": 2.0}))
    assert "noise of std 2 x clip" in hint and "dp.noise_multiplier" in hint
    assert "learning rate is likely too high" in divergence_hint(dp_config(dp=None))
