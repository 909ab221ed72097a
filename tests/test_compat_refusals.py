"""Refusals of pure config combinations come from ``fedbug.config.compat`` (so ``load_config``,
``fedbug run`` and a sweep's validation of every cell refuse them before any data loads), each one
line naming the key and the fix; and every algorithm whose clients send extra tensors beside
their delta declares it (``Algorithm.sends_extras``), which ``dp:`` refuses from the declaration.

Each of these used to get past ``load_config`` and fail only once the run was under way: client-
level DP with SLT (or FedRolex under ``code_counts``) in round 1's aggregation, the others where
the engine built the run."""

from __future__ import annotations

import typing
from typing import Any

import pytest
import yaml
from tiny import TINY_DOC, method_needs, tiny_config

from fedbug.algorithms import ALGORITHMS
from fedbug.cli import main
from fedbug.config import load_config
from fedbug.errors import ConfigError

DP = {"clip": 1.0, "noise_multiplier": 1.0, "delta": 1e-5}

#: FedSeq's vanilla schedule (over the tiny config's 2 rounds)
FEDSEQ = {"algorithm": "fedbabu", "schedule": "vanilla", "evaluation": "personalized"}

#: (overrides of the tiny config, the one-line refusal); each got past load_config before
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "dp-slt": (
        {"algorithm": "slt", **method_needs("slt"), "dp": DP, "weighting": "uniform"},
        "dp: clips and noises the update delta only, and algorithm slt also sends extra tensors "
        "beside it the server would read unprotected; remove dp:, or use an "
        "algorithm that sends one delta (fedavg, fedprox, ...)",
    ),
    "dp-fedrolex-code-counts": (
        {
            "algorithm": "fedrolex",
            "fedrolex": {"bn_linear_weights": "code_counts"},
            "dp": DP,
            "weighting": "uniform",
        },
        "dp: clips and noises the update delta only, and algorithm fedrolex also sends extra "
        "tensors beside it the server would read unprotected; remove dp:, or use "
        "an algorithm that sends one delta (fedavg, fedprox, ...)",
    ),
    "fedper-global": (
        {"algorithm": "fedper", "evaluation": "global"},
        "evaluation: global needs a global model, and algorithm fedper keeps part of every model "
        "on its client, so there is no global model to evaluate; use evaluation: personalized",
    ),
    "lg_fedavg-mean-of-local-models": (
        {"algorithm": "lg_fedavg", "evaluation": "mean_of_local_models"},
        "evaluation: mean_of_local_models needs a global model, and algorithm lg_fedavg keeps "
        "part of every model on its client, so there is no global model to evaluate; use "
        "evaluation: personalized",
    ),
    "processes-cuda": (
        {"executor": "processes", "device": "cuda"},
        "executor: processes runs its workers on the CPU, not device: cuda; use device: cpu (or "
        "auto), or executor: sequential (one process drives the device)",
    ),
    "processes-cuda-1": (
        {"executor": "processes", "device": "cuda:1"},
        "executor: processes runs its workers on the CPU, not device: cuda:1; use device: cpu "
        "(or auto), or executor: sequential (one process drives the device)",
    ),
    "freezefl-upload-full": (
        {
            "method": "freezefl",
            "system": {"abilities": "uniform"},
            "count_flops": True,
            "upload": "full",
        },
        "policy: freezefl charges a client for the units it trains and uploads (its frozen ones "
        "stay home, FreezeFL Sec. IV); set upload: partial (aggregation: full still counts an "
        "unsent unit as unchanged)",
    ),
    "fedexp-global-lr": (
        {"algorithm": "fedexp", "global_lr": 0.5},
        "fedexp sets the global learning rate itself; remove global_lr=0.5",
    ),
    "unfreeze-rounds-start": (
        {**FEDSEQ, "unfreeze_rounds": [1, 0]},
        "unfreeze_rounds must start at 0 (the first sub-layer trains from round 1); got [1, 0]",
    ),
    "unfreeze-rounds-order": (
        {**FEDSEQ, "unfreeze_rounds": [0, 2, 1], "rounds": 4},
        "unfreeze_rounds must be non-decreasing; got [0, 2, 1]",
    ),
    "unfreeze-rounds-past-the-end": (
        {**FEDSEQ, "unfreeze_rounds": [0, 2]},
        "unfreeze_rounds [0, 2]: the last sub-layer unfreezes after round 2, but there are "
        "only 2 rounds; use values below 2",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_load_config_refuses_in_one_line(case):
    over, message = REFUSED[case]
    with pytest.raises(ConfigError) as err:
        tiny_config(**over)
    assert str(err.value) == f"invalid config: {message}"


@pytest.mark.parametrize(
    "over",
    [
        {"algorithm": "fedrolex", "dp": DP, "weighting": "uniform"},  # mean: one delta
        {"algorithm": "fedper", "evaluation": "personalized"},
        {"executor": "processes", "device": "cpu"},
        {"executor": "processes", "device": "auto"},
        {"executor": "sequential", "device": "cuda"},
        {"executor": "cohort", "augment": "none"},
        {"executor": "cohort", "augment": "auto"},
        {"executor": "cohort", "augment": "crop_flip"},  # each client's draws, its generator
        {"algorithm": "fedexp", "global_lr": 1.0},
        {**FEDSEQ, "unfreeze_rounds": [0, 1, 1]},  # their count is checked on the model
    ],
)
def test_the_neighbouring_configs_are_accepted(over):
    tiny_config(**over)


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_fedbug_run_exits_2_in_one_line_and_writes_nothing(case, tmp_path, capsys):
    over, message = REFUSED[case]
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({**TINY_DOC, **over}))
    out = tmp_path / "out"
    rc = main(["run", str(cfg), "--out", str(out), "-q"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert not out.exists() or not any(out.iterdir())


# -- the declaration dp: refuses from ---------------------------------------------------------
def variants() -> list[tuple[str, dict[str, Any]]]:
    """Every registered algorithm at its defaults, and at each other value of each Literal
    option of its block (FedRolex's ``bn_linear_weights: code_counts`` is one)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for name in ALGORITHMS.names():
        out.append((name, {}))
        params = ALGORITHMS.get(name).params_cls
        for field, info in (params.model_fields if params else {}).items():
            if typing.get_origin(info.annotation) is typing.Literal:
                for value in typing.get_args(info.annotation):
                    if value != info.default:
                        out.append((name, {field: value}))
    return out


#: what an option's value needs to run at all: (more of the block, more of the config)
VARIANT_NEEDS: dict[tuple[str, Any], tuple[dict[str, Any], dict[str, Any]]] = {
    ("assign", "by_ability"): ({}, method_needs("fjord")),  # the devices abilities come from
    ("bn_linear_weights", "code_counts"): ({}, {"weighting": "uniform"}),
    ("schedule", "rounds"): ({"switch_rounds": [1]}, {}),
}


@pytest.mark.parametrize(("algorithm", "options"), variants())
def test_an_algorithm_whose_clients_send_extras_declares_it(algorithm, options, monkeypatch):
    """``dp:`` refuses from ``sends_extras`` alone, before the run: every algorithm (under each
    choice of its options) whose client results carry ``extras`` must declare it, and one that
    declares it sends some (a false declaration would refuse a run that could be protected)."""
    from fedbug.engine import run_experiment
    from fedbug.engine.client import LocalRound

    sent: list[bool] = []
    result = LocalRound.result

    def recorded(self: LocalRound) -> Any:
        out = result(self)
        sent.append(bool(out.extras))
        return out

    monkeypatch.setattr(LocalRound, "result", recorded)
    cls = ALGORITHMS.get(algorithm)
    doc = {
        "algorithm": algorithm,
        "evaluation": "global" if cls.has_global_model else "personalized",
        "rounds": 1,
        "num_clients": 4,
        "clients_per_round": 2,
        "local_steps": 1,
        "count_flops": False,
        "threads": 1,
        **method_needs(algorithm),
    }
    for field, value in options.items():
        block, top = VARIANT_NEEDS.get((field, value), ({}, {}))
        doc[algorithm] = {**doc.get(algorithm, {}), field: value, **block}
        doc.update(top)
    cfg = tiny_config(**doc)
    run_experiment(cfg)
    assert sent
    assert any(sent) == cls.sends_extras(cfg), (algorithm, options, sent)


def test_a_toy_session_writing_extras_undeclared_is_still_refused_by_the_dp_aggregate():
    """The engine's check stays, for a declaration that went wrong: an update carrying extras
    is refused as it is added to the DP aggregate."""
    import torch

    from fedbug.core.units import ParamSpace, find_units
    from fedbug.engine.privacy.client_level import DPAggregate

    model = torch.nn.Sequential(torch.nn.Linear(2, 1, bias=False))
    agg = DPAggregate(ParamSpace(model, find_units(model, names=["0"])), 1.0, 2.0)
    with pytest.raises(ConfigError, match=r"also sends extra tensors \(stage\)"):
        agg.add(torch.zeros(2), [True], 1, extras={"stage": torch.ones(1)})


def test_load_config_is_where_it_is_refused():
    """The refusal comes from the config itself (no data set named that could load)."""
    doc = {**TINY_DOC, "dataset": "cifar10", "data_dir": "/nonexistent"}
    with pytest.raises(ConfigError, match="no global model to evaluate"):
        load_config(None, doc={**doc, "algorithm": "fedper", "evaluation": "global"})
