"""The hook contract: flags that go with a hook follow from it or are refused when they disagree.

A method's flags (``stateful_clients``, ``needs_features``, ...) used to be set by hand beside the
hooks they go with, and nothing checked them: an algorithm that returned client state from
``finish_client`` without ``stateful_clients = True`` had its state dropped after every round,
silently. Now a flag that a hook implies is computed from whether the class overrides the hook,
and a flag set by hand that disagrees with the hooks is a TypeError naming the class, the flag
and the hook, raised when the class is defined (before it can be registered).
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from tiny import TwoLayer, data, registries_restored, task

import fedbug
from fedbug.algorithms import ALGORITHMS, Algorithm, ClientSession, LocalCtx
from fedbug.algorithms.fedavg import FedAvg
from fedbug.core.units import ParamSpace, find_units
from fedbug.engine.client import ClientRuntime, TrainSettings, train_client
from fedbug.policies import POLICIES, build_policy
from fedbug.policies.base import FreezePolicy, PolicySession
from fedbug.selection.base import SELECTIONS, Selection

#: what each client's ``finish_client`` found in its state: the rounds it had trained before
SEEN: list[float] = []


class CountRounds(FedAvg):
    """Counts, in each client's own state, the rounds it trained; no flag says it has state."""

    name = "count_rounds"

    def finish_client(self, ctx: LocalCtx, delta: torch.Tensor) -> dict[str, torch.Tensor]:
        before = ctx.state.get("rounds", torch.zeros(()))
        SEEN.append(float(before))
        return {"rounds": before + 1}


@pytest.fixture
def count_rounds():
    SEEN.clear()
    with registries_restored(ALGORITHMS):
        ALGORITHMS.register(CountRounds.name)(CountRounds)
        yield


def test_state_returned_without_a_flag_is_kept_between_rounds(count_rounds):
    cfg = fedbug.config(
        algorithm="count_rounds",
        model="mlp",
        num_clients=2,
        clients_per_round=2,
        rounds=3,
        local_steps=1,
        batch_size=8,
        count_flops=False,
        threads=1,
    )
    fedbug.run(cfg)
    # both clients train in each of 3 rounds: each sees 0, then 1, then 2 rounds behind it
    assert sorted(SEEN) == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]


def test_a_state_hook_makes_the_algorithm_stateful():
    assert CountRounds.stateful_clients
    assert not FedAvg.stateful_clients
    assert ALGORITHMS.get("feddyn").stateful_clients
    assert ALGORITHMS.get("scaffold").stateful_clients

    class InitOnly(FedAvg):
        def init_client_state(self, space: ParamSpace) -> dict[str, torch.Tensor]:
            return {"seen": torch.zeros(())}

    assert InitOnly.stateful_clients


def test_stateful_clients_false_beside_a_state_hook_is_refused():
    with pytest.raises(TypeError) as e:

        class Forgetful(FedAvg):
            stateful_clients = False

            def finish_client(self, ctx: LocalCtx, delta: torch.Tensor) -> dict:
                return {"x": delta}

    msg = str(e.value)
    assert "Forgetful" in msg and "stateful_clients" in msg and "finish_client" in msg


def test_a_flag_set_without_its_hook_is_refused():
    with pytest.raises(TypeError, match="Stateless.*stateful_clients.*init_client_state"):

        class Stateless(FedAvg):
            stateful_clients = True

    with pytest.raises(TypeError, match="Blind.*needs_features.*extra_loss"):

        class Blind(FedAvg):
            needs_features = True


def test_a_flag_that_agrees_with_its_hooks_is_accepted():
    class Explicit(FedAvg):
        stateful_clients = True

        def finish_client(self, ctx: LocalCtx, delta: torch.Tensor) -> dict:
            return {"x": delta}

    assert Explicit.stateful_clients


def _runtime(alg: Algorithm) -> ClientRuntime:
    model = TwoLayer()
    space = ParamSpace(model, find_units(model, torch.zeros(1, 2)))
    settings = TrainSettings(local_steps=1, batch_size=2, weight_decay=0.0, count_flops=False)
    return ClientRuntime(model, space, build_policy("none"), alg, settings, lambda x: x)


def test_extra_loss_gets_the_features_without_a_flag():
    got = []

    class Penalty(FedAvg):
        def extra_loss(self, ctx, loss, features):
            got.append(features)
            return loss + 0.0 * features.pow(2).sum()

    assert Penalty.needs_features
    train_client(
        torch.zeros(12), task(), data([[1.0, 2.0], [0.5, -1.0]], [0, 1]), {}, _runtime(Penalty())
    )
    assert got[0] is not None and got[0].shape == (2, 2)  # the classifier's input


def test_extra_modules_need_wrap_model():
    with pytest.raises(TypeError, match="Headless.*extra_modules.*wrap_model"):

        class Headless(FedAvg):
            extra_modules = ("personal_head",)


def test_no_global_model_needs_local_units():
    with pytest.raises(TypeError, match="Nowhere.*has_global_model.*local_units"):

        class Nowhere(FedAvg):
            has_global_model = False


class KeepsHead(FedAvg):
    """Keeps the model's last unit on each client, yet keeps the default has_global_model."""

    name = "keeps_head"

    def local_units(self, num_units: int) -> tuple[int, ...]:
        return (num_units - 1,)


def test_a_global_model_without_the_units_kept_on_clients_is_refused_at_build():
    """The class body cannot see which units local_units names: the run's build does, before
    any round (a global evaluation would otherwise score a head no round trained)."""
    with registries_restored(ALGORITHMS):
        ALGORITHMS.register(KeepsHead.name)(KeepsHead)
        cfg = fedbug.config(algorithm="keeps_head", model="mlp", num_clients=2,
                            clients_per_round=2, rounds=1, local_steps=1, batch_size=8,
                            count_flops=False, threads=1)  # fmt: skip
        with pytest.raises(TypeError, match=r"KeepsHead keeps model unit\(s\) \[2\].*"
                           "has_global_model = False"):  # fmt: skip
            fedbug.run(cfg)


def test_a_selection_that_needs_local_deltas_reads_them_in_update():
    with pytest.raises(TypeError, match="Deaf.*needs_local_deltas.*update"):

        class Deaf(Selection):
            needs_local_deltas = True

    class Listens(Selection):
        needs_local_deltas = True

        def update(self, feedback):
            return None

    assert Listens.needs_local_deltas


def test_every_registered_method_passes_its_own_check():
    for _, cls in ALGORITHMS.items():
        assert cls.stateful_clients == cls.overrides("init_client_state", "finish_client")
        assert cls.needs_features == cls.overrides("extra_loss")
    for _, sel in SELECTIONS.items():
        assert not sel.needs_local_deltas or sel.update is not Selection.update
    assert list(POLICIES)  # policies have no flags that go with a hook


# -- the hook signatures are typed ------------------------------------------------------------

#: parameters that stay ``Any`` on purpose: a model's output is whatever its forward returns
_ANY_OK = {"output"}
_HOOK_CLASSES = (Algorithm, ClientSession, FreezePolicy, PolicySession, Selection)


def _hook_params():
    for owner in _HOOK_CLASSES:
        for name, fn in inspect.getmembers(owner, callable):
            if name.startswith("_") or fn.__qualname__.split(".")[0] != owner.__name__:
                continue
            for param in inspect.signature(fn).parameters:
                if param not in ("self", "cls"):
                    yield owner.__name__, name, param, fn.__annotations__.get(param)


def test_hook_parameters_are_typed():
    untyped = [
        f"{owner}.{hook}({param})"
        for owner, hook, param, hint in _hook_params()
        if param not in _ANY_OK and (hint is None or re.fullmatch(r"Any( \| None)?", hint))
    ]
    assert untyped == []
