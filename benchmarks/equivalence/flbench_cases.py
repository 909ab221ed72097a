"""The FL-bench pair's cases and fedbug's side of them (no FL-bench code needed here).

A case is a scenario of one of the two earlier pairs, run on fedbug's side by that pair's driver:

* ``kind: fedbug`` (FedAvg, FedProx, FedDyn, SCAFFOLD): :class:`scenario.Scenario` and
  :func:`fedbug_side.run_rounds` (the CIFAR CNN, 2 clients of 4 samples, full-batch steps; in
  FL-bench one batch an epoch, so ``common.local_epoch`` = K);
* ``kind: pfl`` (FedPer, LG-FedAvg, FedRep, FedROD, FedBABU): :class:`pfl_scenario.PflScenario`
  and :func:`fedbug_pfl.run_rounds` (FedSeq's CNN, 3 clients of 6, 4, 8 samples, mini-batches
  of 2, 2 epochs; FedBABU fine-tuned 3 epochs);

plus FL-bench's own options for the method (``flbench``: hydra overrides such as
``fedprox.mu=0.01``), fedbug config keys the scenario has no field for (``fedbug_config``, e.g.
``head_units: 3``), and ``as_code``: ``forget_client_state`` runs fedbug's loop with every
client's state reset each round (what FL-bench's SCAFFOLD server does with c_i).
:func:`fedbug_run` gives fedbug's side of a case; the harness (``run_flbench.py``) and the
fixture test (``tests/test_equivalence_flbench.py``) both call it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from benchmarks.equivalence import fedbug_pfl, fedbug_side
from benchmarks.equivalence.pfl_scenario import PflScenario
from benchmarks.equivalence.scenario import Scenario

OFF = 1e9  # fedbug's clip_grad_norm where FL-bench does not clip (every method but FedDyn)


@dataclass(frozen=True)
class FlbCase:
    name: str
    scenario: Scenario | PflScenario
    expect: str = "match"
    fixture: bool = False
    flbench: tuple[str, ...] = ()  # FL-bench overrides for the method (hydra syntax)
    fedbug_config: dict[str, Any] = field(default_factory=dict)  # pfl kind only
    as_code: str = ""  # "forget_client_state": fedbug's loop as FL-bench's SCAFFOLD runs
    flbench_method: str = ""  # FL-bench's method when it is not fedbug's algorithm's namesake

    @property
    def kind(self) -> str:
        return "pfl" if isinstance(self.scenario, PflScenario) else "fedbug"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "scenario": self.scenario.to_json(),
            "expect": self.expect,
            "flbench": list(self.flbench),
            "fedbug_config": dict(self.fedbug_config),
            "as_code": self.as_code,
            "flbench_method": self.flbench_method,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> FlbCase:
        scen = PflScenario if doc["kind"] == "pfl" else Scenario
        return cls(
            doc["name"],
            scen.from_json(doc["scenario"]),
            expect=doc["expect"],
            flbench=tuple(doc["flbench"]),
            fedbug_config=dict(doc["fedbug_config"]),
            as_code=doc["as_code"],
            flbench_method=doc["flbench_method"],
        )


@contextlib.contextmanager
def _fedbug_as(case: FlbCase) -> Iterator[None]:
    """Patch the drivers' module globals for the case's extras, restored afterwards."""
    saved: list[tuple[Any, str, Any]] = []

    def patch(mod: Any, name: str, value: Any) -> None:
        saved.append((mod, name, getattr(mod, name)))
        setattr(mod, name, value)

    if case.fedbug_config:
        config_doc = fedbug_pfl.config_doc
        patch(fedbug_pfl, "config_doc", lambda s: {**config_doc(s), **case.fedbug_config})
    if case.as_code == "forget_client_state":
        train_client = fedbug_side.train_client

        def fresh_state(weights, task, data, state, rt):  # every round from a fresh c_i = 0
            return train_client(weights, task, data, rt.algorithm.init_client_state(rt.space), rt)

        patch(fedbug_side, "train_client", fresh_state)
        patch(fedbug_pfl, "train_client", fresh_state)
    elif case.as_code:
        raise ValueError(f"unknown as_code {case.as_code!r}")
    try:
        yield
    finally:
        for mod, name, value in reversed(saved):
            setattr(mod, name, value)


def fedbug_run(case: FlbCase, perturb: float = 0.0) -> Any:
    """fedbug's side: a ``FedbugRun`` (kind fedbug) or a ``PflRun`` (kind pfl)."""
    with _fedbug_as(case):
        if case.kind == "pfl":
            return fedbug_pfl.run_rounds(case.scenario, perturb=perturb)  # type: ignore[arg-type]
        return fedbug_side.run_rounds(case.scenario, perturb=perturb)  # type: ignore[arg-type]


def fedbug_engine(case: FlbCase) -> Any:
    """The same case through ``fedbug.run``: its final weights (None for an as-code case, which
    the engine does not run)."""
    if case.as_code:
        return None
    with _fedbug_as(case):
        if case.kind == "pfl":
            return fedbug_pfl.run_engine(case.scenario)[0]  # type: ignore[arg-type]
        return fedbug_side.run_engine(case.scenario)  # type: ignore[arg-type]


# -- the cases ---------------------------------------------------------------------------------
CNN = {"model": "standard_cnn", "local_steps": 25, "clip": OFF}
ALPHA, WD = 0.01, 1e-3
FEDDYN_WD = (
    "differs (explained 1): FL-bench's FedDyn has no alpha*theta term (FL-Simulator, which it "
    "follows, passes weight_decay + alpha to SGD; FL-bench does not)"
)
SCAFFOLD_CI = (
    "differs (explained 2): FL-bench's server never stores a client's c_i, so every round starts "
    "from c_i = 0 (round 1 equal)"
)
LG = (
    "differs (explained 3): FL-bench's LG-FedAvg shares the FIRST num_global_layers layers and "
    "keeps the rest local (fedbug, PFLlib: the head global, the base local)"
)
ROD = (
    "differs (explained 4): FL-bench's FedRoD clients never load the global model (its keys lack "
    "the client model's 'generic_model.' prefix) and train the personal head on CE(z_p) through "
    "the body"
)
SIZE_ONE = (
    "differs (explained 6): FL-bench's loops skip a batch of one sample: a client of 5 samples "
    "(batch 2) takes 2 steps an epoch, one of 1 sample none"
)
NEWCOMER = (
    "differs (explained 5): a client first selected after round 1 gets FL-bench's averaged head "
    "(the server averages every parameter), fedbug's initial head"
)


def _cases() -> list[FlbCase]:
    out: list[FlbCase] = []
    fl = Scenario("flb-fedavg", "fedavg", **CNN)
    out.append(FlbCase("fedavg", fl, fixture=True))
    s = dataclasses.replace(fl, algorithm="fedprox", params={"mu": 0.01})
    out.append(FlbCase("fedprox", s, fixture=True, flbench=("fedprox.mu=0.01",)))
    dyn = {"algorithm": "feddyn", "params": {"alpha": ALPHA}, "clip": 10.0}
    flags = (f"+feddyn.alpha={ALPHA}", "+feddyn.max_grad_norm=10.0")
    s = dataclasses.replace(fl, **dyn)
    out.append(FlbCase("feddyn", s, FEDDYN_WD, flbench=flags))
    # FL-bench given weight_decay = wd + alpha, as FL-Simulator's client builds its SGD
    wd = (f"optimizer.weight_decay={WD + ALPHA}",)
    out.append(FlbCase("feddyn-wd-alpha", s, fixture=True, flbench=flags + wd))
    # clipping that bites (0.5; the smooth CNN's gradient norms are 1-5): FL-bench clips the
    # loss's gradient and SGD adds (wd + alpha) theta after it: fedbug's feddyn clip: loss
    clip = (f"+feddyn.alpha={ALPHA}", "+feddyn.max_grad_norm=0.5")
    s = dataclasses.replace(fl, **{**dyn, "clip": 0.5, "params": {"alpha": ALPHA, "clip": "loss"}})
    out.append(FlbCase("feddyn-clip-loss-wd-alpha", s, fixture=True, flbench=clip + wd))
    s = dataclasses.replace(fl, algorithm="scaffold", params={"steps": "all"})
    out.append(FlbCase("scaffold", s, SCAFFOLD_CI))
    out.append(FlbCase("scaffold-as-code", s, fixture=True, as_code="forget_client_state"))
    out.append(FlbCase("relu-fedavg", dataclasses.replace(fl, smooth=False), "chaotic"))
    # the personalized methods, on the PFLlib pair's scenario
    out.append(FlbCase("fedper", PflScenario("flb-fedper", "fedper"), fixture=True))
    lg = ("+lgfedavg.num_global_layers=1",)
    out.append(FlbCase("lg_fedavg", PflScenario("flb-lg_fedavg", "lg_fedavg"), LG, flbench=lg))
    s = PflScenario("flb-lg_fedavg-as-fedper3", "fedper")
    out.append(FlbCase("lg_fedavg-as-fedper-head3", s, fixture=True, flbench=lg,
                       fedbug_config={"head_units": 3}, flbench_method="lgfedavg"))  # fmt: skip
    s = PflScenario("flb-fedrep", "fedrep", head_epochs=1, local_epochs=2)
    out.append(FlbCase("fedrep", s, fixture=True, flbench=("+fedrep.train_body_epoch=2",)))
    s = PflScenario("flb-fedrep-head3", "fedrep", head_epochs=3, local_epochs=1)
    out.append(FlbCase("fedrep-head3", s, fixture=True, flbench=("+fedrep.train_body_epoch=1",)))
    out.append(FlbCase("fedrod", PflScenario("flb-fedrod", "fedrod"), ROD))
    s = PflScenario("flb-fedbabu", "fedbabu", finetune_epochs=3)
    out.append(FlbCase("fedbabu", s, fixture=True))
    s = PflScenario("flb-fedper-2of3", "fedper", rounds=3, clients_per_round=2)
    out.append(FlbCase("fedper-2of3", s, NEWCOMER))
    s = PflScenario("flb-fedper-batch-of-one", "fedper", sizes=(5, 1, 8))
    out.append(FlbCase("fedper-batch-of-one", s, SIZE_ONE))
    # SCAFFOLD with mini-batches: FL-bench's local_epoch counts local STEPS (one batch each),
    # y_delta averaged without weights: fedbug's local_steps and weighting: uniform
    s = PflScenario("flb-scaffold-minibatch", "scaffold", rounds=3)
    cfg = {"local_steps": 5, "weighting": "uniform"}
    forget, steps = "forget_client_state", ("common.local_epoch=5",)
    out.append(FlbCase("scaffold-minibatch-as-code", s, fixture=True, fedbug_config=cfg,
                       flbench=steps, as_code=forget))  # fmt: skip
    s = PflScenario("flb-fedbabu-2of3", "fedbabu", rounds=3, clients_per_round=2,
                    finetune_epochs=3)  # fmt: skip
    out.append(FlbCase("fedbabu-2of3", s, fixture=True))
    return out


CASES = _cases()
