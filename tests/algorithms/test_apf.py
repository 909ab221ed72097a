"""APF (adaptive parameter freezing, Chen et al. ICDCS 2021): the server's statistics worked by
hand over four rounds, the client's restore of frozen entries, bytes, and the engine (frozen
entries unchanged, resume, worker processes, refusals).

The hand-worked rounds use ema_alpha 0.5 so that every number is a short binary fraction:
E = E/2 + g/2, A = A/2 + |g|/2, P = |E|/A, with g = w_before - w_after the round's change."""

from __future__ import annotations

import pytest
import torch
from executor_checks import assert_same_run, flower_run
from tiny import TwoLayer, data, set_weights, tiny_config, without_timing

from fedbug.algorithms import ALGORITHMS
from fedbug.algorithms.apf import APF, APFParams
from fedbug.config import load_config
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine import run_experiment
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientRuntime, ClientTask, TrainSettings, train_client
from fedbug.errors import ConfigError
from fedbug.policies import build_policy


def test_registered_with_the_code_defaults():
    assert ALGORITHMS.get("apf") is APF
    p = APF().params
    assert (p.ema_alpha, p.stable_threshold, p.tighten_at, p.random_freezing) == (
        0.99,
        0.05,
        0.8,
        "none",
    )


# -- the server's statistics, by hand ---------------------------------------------------------
def _line() -> ParamSpace:
    """Linear(5, 1): one unit of 6 entries (5 weights, 1 bias)."""
    model = torch.nn.Linear(5, 1)
    return ParamSpace(model, find_units(model, torch.zeros(1, 5)))


def _round(alg: APF, space: ParamSpace, w, state, r, d, n=1):
    """One round with a single client whose update is ``d`` on the entries it was sent as
    active (0 on the frozen ones, as a client's restore leaves them)."""
    active = alg.payload(state)["active"]
    agg = Aggregate(space, "samples")
    agg.add(torch.where(active, torch.tensor(d), 0.0), [True], n, active)
    step = alg.server_update(w, agg, state, r, 1)
    return active, step


def test_four_rounds_of_statistics_by_hand():
    space = _line()
    alg = APF(params=APFParams(ema_alpha=0.5, stable_threshold=0.4))
    w = torch.zeros(6)
    s = alg.init_server_state(w, 1)
    assert alg.payload(s)["active"].all()  # check round 0, thaw round 0: all active

    # round 1: every entry moves by +1, g = -1: E = -1/2, A = 1/2, P = 1 (not < 0.4): length
    # 0, thaw at 0 + 0 + 1 = 1 = the next check round
    active, step = _round(alg, space, w, s, 1, [1.0] * 6)
    w1, s = step.weights, step.state
    assert torch.equal(w1, torch.ones(6))
    assert torch.equal(s["ema"], torch.full((6,), -0.5))
    assert torch.equal(s["abs_ema"], torch.full((6,), 0.5))
    assert s["length"].tolist() == [0] * 6 and s["thaw"].tolist() == [1] * 6
    assert int(s["check"]) == 1 and float(s["threshold"]) == 0.4
    assert step.metrics == {"apf_frozen": 0.0, "apf_threshold": 0.4}

    # round 2: entries 0-4 come back (-1, g = +1): E = 1/4, A = 3/4, P = 1/3 < 0.4: frozen,
    # length 1, thaw at 1 + 1 + 1 = 3; entry 5 goes on (+1): P = 1, active. 5 of 6 frozen
    # (0.83 > 0.8): the threshold halves to 0.2
    active, step = _round(alg, space, w1, s, 2, [-1.0] * 5 + [1.0])
    w2, s = step.weights, step.state
    assert torch.equal(w2, torch.tensor([0.0] * 5 + [2.0]))
    assert torch.equal(s["ema"], torch.tensor([0.25] * 5 + [-0.75]))
    assert torch.equal(s["abs_ema"], torch.full((6,), 0.75))
    assert s["length"].tolist() == [1] * 5 + [0]
    assert s["thaw"].tolist() == [3] * 5 + [2]
    assert int(s["check"]) == 2 and float(s["threshold"]) == 0.2
    assert alg.payload(s)["active"].tolist() == [False] * 5 + [True]

    # round 3: only entry 5 is sent; the frozen entries keep their weights bitwise and their
    # statistics, and thaw exactly now (thaw 3 = check 3)
    active, step = _round(alg, space, w2, s, 3, [9.0] * 5 + [1.0])
    w3, s3 = step.weights, step.state
    assert torch.equal(w3[:5], w2[:5]) and float(w3[5]) == 3.0
    assert torch.equal(s3["ema"][:5], s["ema"][:5]) and float(s3["ema"][5]) == -0.875
    assert s3["length"].tolist() == [1] * 5 + [0] and s3["thaw"].tolist() == [3] * 6
    assert int(s3["check"]) == 3 and float(s3["threshold"]) == 0.2
    assert step.metrics["apf_frozen"] == pytest.approx(5 / 6)
    assert alg.payload(s3)["active"].all()

    # round 4: entries 0, 1 unstable (+1, g = -1): E = 1/8 - 1/2 = -3/8, A = 3/8 + 1/2 = 7/8,
    # P = 3/7 >= 0.2: length 1 -> 0 (halved), thaw at 4; entries 2-4 stable (+1/4, g = -1/4):
    # E = 1/8 - 1/8 = 0, P = 0 < 0.2: length 1 -> 2, thaw at 3 + 2 + 1 = 6 (frozen in rounds
    # 5 and 6); entry 5: P = 1, active. Half frozen: the threshold stays
    active, step = _round(alg, space, w3, s3, 4, [1.0, 1.0, 0.25, 0.25, 0.25, 1.0])
    s4 = step.state
    assert torch.equal(s4["ema"], torch.tensor([-0.375, -0.375, 0.0, 0.0, 0.0, -0.9375]))
    assert torch.equal(s4["abs_ema"][:5], torch.tensor([0.875, 0.875, 0.5, 0.5, 0.5]))
    assert s4["length"].tolist() == [0, 0, 2, 2, 2, 0]
    assert s4["thaw"].tolist() == [4, 4, 6, 6, 6, 4]
    assert int(s4["check"]) == 4 and float(s4["threshold"]) == 0.2
    assert alg.payload(s4)["active"].tolist() == [True, True, False, False, False, True]
    # the state a round started from is left as it was (a resumed round starts from it)
    assert s3["length"].tolist() == [1] * 5 + [0] and int(s3["check"]) == 3


def _state(alg: APF, n: int, **values) -> dict[str, torch.Tensor]:
    s = alg.init_server_state(torch.zeros(n), 1)
    for key, v in values.items():
        s[key] = torch.as_tensor(v, dtype=s[key].dtype).expand_as(s[key]).clone()
    return s


def test_an_unstable_entry_halves_its_length_and_thaws_sooner():
    space = _line()
    alg = APF(params=APFParams(ema_alpha=0.5, stable_threshold=0.4))
    # length 2 (frozen twice already), thawed at check 7; E = A = 1/2: one more g = -1 gives
    # E = -1/4, A = 3/4, P = 1/3 < 0.4 (stable: 3); g = +1 gives E = 3/4, A = 3/4, P = 1
    s = _state(alg, 6, length=2, thaw=7, check=7, ema=0.5, abs_ema=0.5)
    _, step = _round(alg, space, torch.zeros(6), s, 8, [1.0] * 3 + [-1.0] * 3)
    assert step.state["length"].tolist() == [3] * 3 + [1] * 3
    assert step.state["thaw"].tolist() == [11] * 3 + [9] * 3  # 7 + length + 1


def test_the_threshold_halves_every_round_while_over_the_share():
    space = _line()
    alg = APF(params=APFParams(stable_threshold=1.5))
    s = _state(alg, 6, length=3, thaw=5, check=2)  # all frozen until check round 5
    thresholds, w = [], torch.zeros(6)
    for r in (3, 4, 5):
        active, step = _round(alg, space, w, s, r, [1.0] * 6)
        assert not active.any() and torch.equal(step.weights, w)  # nothing sent, nothing moves
        s = step.state
        thresholds.append(float(s["threshold"]))
    assert thresholds == [0.75, 0.375, 0.375]  # at check 5 every entry thaws: share 0


def test_mean_over_the_clients_that_sent_an_entry():
    space = _line()
    alg = APF(params=APFParams(ema_alpha=0.5, stable_threshold=0.4))
    s = _state(alg, 6, thaw=[0, 0, 0, 1, 1, 1])  # entries 3-5 frozen this round
    active = alg.payload(s)["active"]
    agg = Aggregate(space, "samples")
    agg.add(torch.where(active, torch.tensor(1.0), 0.0), [True], 1, active)
    agg.add(torch.where(active, torch.tensor(4.0), 0.0), [True], 2, active)
    w = torch.linspace(-1.0, 1.0, 6)
    step = alg.server_update(w, agg, s, 1, 2)
    assert torch.equal(step.weights[3:], w[3:])
    torch.testing.assert_close(step.weights[:3], w[:3] + 3.0)  # (1 * 1 + 2 * 4) / 3


def test_an_active_entry_nobody_sent_keeps_its_statistics_and_stays_active():
    """A freeze policy that froze a unit for every client: its active entries were not sent;
    they stay active, their statistics untouched (no change is no evidence of stability)."""
    model = TwoLayer()
    space = ParamSpace(model, find_units(model, torch.zeros(1, 2)))
    alg = APF(params=APFParams(ema_alpha=0.5, stable_threshold=0.4))
    s = _state(alg, 12, ema=0.25, abs_ema=0.75, length=1, thaw=3, check=3)
    active = alg.payload(s)["active"]
    agg = Aggregate(space, "samples")
    agg.add(torch.ones(12), [False, True], 1, active)  # unit 0 not sent
    step = alg.server_update(torch.zeros(12), agg, s, 4, 1)
    first = space.unit_slices[0]
    assert torch.equal(step.weights[first], torch.zeros(6))
    assert step.state["length"][first].tolist() == [1] * 6
    assert step.state["thaw"][first].tolist() == [4] * 6  # the next check round
    assert torch.equal(step.state["ema"][first], torch.full((6,), 0.25))
    assert alg.payload(step.state)["active"].all()


# -- random freezing (the aggressive variant), the two versions of the authors' code -----------
def _big_line(n: int) -> ParamSpace:
    model = torch.nn.Linear(n - 1, 1)
    return ParamSpace(model, find_units(model, torch.zeros(1, n - 1)))


@pytest.mark.parametrize("variant", ["release2021", "head2022"])
def test_random_freezing_draws_are_addressed_and_bounded(variant):
    n = 2001
    space = _big_line(n)
    alg = APF(params=APFParams(ema_alpha=0.5, stable_threshold=1e-9, random_freezing=variant))
    # P = 1 >= threshold: every refreshed entry gets length 0, thaw = check + 1 before the draw
    s = _state(alg, n, check=40, thaw=[40] * 1000 + [45] * 1001)
    _, a = _round(alg, space, torch.zeros(n), s, 41, [1.0] * n)
    _, b = _round(alg, space, torch.zeros(n), s, 41, [1.0] * n)
    assert torch.equal(a.state["thaw"], b.state["thaw"])  # the same round draws the same
    extra_active = a.state["thaw"][:1000] - 41
    extra_frozen = a.state["thaw"][1000:] - 45
    if variant == "release2021":
        # rand * 100 < check / 20 = 2 (probability 2%): + int(rand * 100), so 0 or 1; only on
        # the entries just checked
        assert set(extra_active.tolist()) == {0, 1} and 0 < int(extra_active.sum()) < 40
        assert not extra_frozen.any()
        s10 = _state(alg, n, check=10, thaw=[10] * n)  # before check round 20: never
        _, c = _round(alg, space, torch.zeros(n), s10, 11, [1.0] * n)
        assert (c.state["thaw"] == 11).all()
    else:
        # + 1 with probability 1/2 on every entry, frozen ones too
        assert set(extra_active.tolist()) == {0, 1} and 400 < int(extra_active.sum()) < 600
        assert set(extra_frozen.tolist()) == {0, 1} and 400 < int(extra_frozen.sum()) < 600
    other = _state(alg, n, check=40, thaw=[40] * 1000 + [45] * 1001)
    other["seed"] = other["seed"] + 1  # another run's seed: other draws
    _, d = _round(alg, space, torch.zeros(n), other, 41, [1.0] * n)
    assert not torch.equal(a.state["thaw"], d.state["thaw"])


# -- the client: frozen entries put back after every step ------------------------------------
W0 = [0.1, -0.2, 0.3, 0.4, 0.0, 0.1, 0.5, -0.3, 0.2, 0.1, 0.0, -0.1]
ACTIVE = [True, False, True, True, False, True, False, True, True, True, False, False]


def test_client_puts_frozen_entries_back_and_sends_the_active_ones():
    model = TwoLayer()
    set_weights(model, W0)
    space = ParamSpace(model, find_units(model, torch.zeros(1, 2)))
    settings = TrainSettings(
        local_steps=3, batch_size=2, momentum=0.9, weight_decay=0.01, count_flops=False
    )
    rt = ClientRuntime(model, space, build_policy("none"), APF(), settings, lambda x: x)
    w0 = space.flatten(model)
    active = torch.tensor(ACTIVE)
    task = ClientTask(1, 0, 0, 0.1, 2.0, payload={"active": active})
    d = data([[1.0, 2.0], [0.5, -1.0]], [0, 1])
    res = train_client(w0, task, d, {}, rt)
    assert torch.equal(res.delta[~active], torch.zeros(5))  # bitwise: put back every step
    assert (res.delta[active] != 0).all()
    assert torch.equal(res.entries, active)
    assert res.bytes_up == res.bytes_down == 4 * 7 and res.trained_params == 7

    # by hand: SGD (momentum, weight decay) on the whole model, frozen entries copied back
    # after each step; the momentum of a frozen entry goes on (it never moves the entry)
    hand = TwoLayer()
    set_weights(hand, W0)
    opt = torch.optim.SGD(hand.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    frozen = torch.tensor(W0)[~active]
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(hand(d.x), d.y).backward()
        opt.step()
        flat = torch.nn.utils.parameters_to_vector(hand.parameters()).detach()
        flat[~active] = frozen
        torch.nn.utils.vector_to_parameters(flat, hand.parameters())
    got = w0 + res.delta
    torch.testing.assert_close(
        got, torch.nn.utils.parameters_to_vector(hand.parameters()).detach(), rtol=0, atol=1e-6
    )


def test_client_without_the_mask_is_refused():
    model = TwoLayer()
    space = ParamSpace(model, find_units(model, torch.zeros(1, 2)))
    settings = TrainSettings(local_steps=1, batch_size=1, weight_decay=0.0, count_flops=False)
    rt = ClientRuntime(model, space, build_policy("none"), APF(), settings, lambda x: x)
    with pytest.raises(ValueError, match="active"):
        train_client(
            space.flatten(model), ClientTask(1, 0, 0, 0.1, 1.0), data([[1.0, 2.0]], [0]), {}, rt
        )


# -- the engine ----------------------------------------------------------------------------
def test_everything_freezes_after_round_one_then_thaws():
    """Threshold 1.5 > every P <= 1: each entry that moved in round 1 freezes for round 2 (the
    global model keeps it bitwise, no client sends it), the threshold halves, round 3 sends all."""
    cfg = tiny_config(algorithm="apf", apf={"stable_threshold": 1.5}, rounds=3, count_flops=False)
    one = run_experiment(cfg.model_copy(update={"rounds": 1}))
    two = run_experiment(cfg.model_copy(update={"rounds": 2}))
    res = run_experiment(cfg)
    r1, r2, r3 = res.records
    total = one.weights.numel()
    clients = r1["num_clients"]
    assert r1["bytes_up"] == r1["bytes_down"] == clients * 4 * total
    sent = r2["bytes_up"] // (4 * clients)  # the entries still active in round 2
    assert r2["bytes_up"] == r2["bytes_down"] and sent < total // 100
    assert r2["apf_frozen"] == pytest.approx(1 - sent / total)
    assert int((two.weights != one.weights).sum()) <= sent  # frozen entries did not move
    assert r1["apf_threshold"] == 0.75 and r2["apf_threshold"] == 0.75
    assert r3["bytes_up"] == clients * 4 * total


@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path):
    cfg = tiny_config(
        algorithm="apf",
        apf={"stable_threshold": 0.5, "ema_alpha": 0.5},
        rounds=4,
        checkpoint_every=1,
        count_flops=False,
    )
    full = run_experiment(cfg, tmp_path / "full")
    assert any(r["apf_frozen"] > 0 for r in full.records)  # something froze
    run_experiment(cfg, tmp_path / "cut", stop_after=2)
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)
    assert torch.equal(resumed.weights, full.weights)


@pytest.mark.slow
def test_worker_processes_give_the_in_process_numbers():
    cfg = tiny_config(
        algorithm="apf", apf={"stable_threshold": 0.5, "ema_alpha": 0.5}, threads=1,
        count_flops=False,
    )  # fmt: skip
    seq = run_experiment(cfg)
    par = run_experiment(cfg.model_copy(update={"executor": "processes", "workers": 2}))
    assert without_timing(par.records) == without_timing(seq.records)
    assert torch.equal(par.weights, seq.weights)


def test_flowers_message_path_gives_the_in_process_numbers():
    """The mask travels in the payload and the held entries in each reply: with entries frozen
    in rounds 2 and 3, Flower's serialised messages give the in-process numbers bitwise."""
    cfg = tiny_config(
        algorithm="apf", apf={"stable_threshold": 0.5, "ema_alpha": 0.5}, rounds=3, threads=1,
        count_flops=False,
    )  # fmt: skip
    here = run_experiment(cfg)
    assert here.records[-1]["apf_frozen"] > 0
    assert_same_run(flower_run(cfg), here)


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"upload": "full"}, "apf clients send only their active entries; use upload: partial"),
        ({"apf": {"ema_alpha": 1.0}}, r"apf\.ema_alpha"),
        ({"apf": {"stable_threshold": 0}}, r"apf\.stable_threshold"),
        ({"apf": {"tighten_at": 1.5}}, r"apf\.tighten_at"),
        ({"apf": {"random_freezing": True}}, "release2021"),
    ],
)
def test_refusals_are_one_line(doc, match):
    with pytest.raises(ConfigError, match=match) as e:
        tiny_config(algorithm="apf", **doc)
    assert "\n" not in str(e.value)


def test_random_freezing_off_as_yaml_writes_it():
    cfg = load_config(None, doc={"algorithm": "apf", "apf": {"random_freezing": False}})
    assert cfg.options("apf").random_freezing == "none"
