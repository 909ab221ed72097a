"""Golden numbers: a short run of every config family gives the final weights (SHA-256) and the
round records recorded in ``golden.json`` before the package was reshaped (issue 14).

A change that moves a number on purpose (a fixed drift) rewrites the file with
``python tests/test_golden.py --write`` and says which family changed and why in its commit.

SHA-256 equality is the promise on one kind of machine. The file records the CPU capability
torch dispatched to when it was written; on a machine with another one (AVX2 vs AVX-512 kernels
round differently), the test compares the weights' fingerprint to float32 rounding instead.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import without_timing

from fedbug.config import load_config
from fedbug.engine import run_experiment, weights_sha256

GOLDEN = Path(__file__).with_name("golden.json")

BASE: dict[str, Any] = {
    "name": "golden",
    "dataset": "digits",
    "model": "digits_cnn",
    "num_clients": 8,
    "clients_per_round": 3,
    "rounds": 2,
    "local_steps": 4,
    "batch_size": 16,
    "eval_batch_size": 256,
    "count_flops": False,
    "threads": 1,
    "lr": 0.05,
}
SIM = {"count_flops": True, "system": {"abilities": "uniform"}, "unbalanced_sigma": 0.5}
PFL = {"evaluation": "personalized", "finetune_epochs": 1, "augment": "none"}
GU = {"policy": "bottom_up", "bottom_up": {"gu_ratio": 0.5}}

FAMILIES: dict[str, dict[str, Any]] = {
    **{f"fedbug-{a}": {**GU, "algorithm": a} for a in ("fedavg", "fedprox", "feddyn")},
    "fedbug-fedexp": {**GU, "algorithm": "fedexp"},
    "fedbug-feddecorr": {**GU, "algorithm": "feddecorr"},
    "vanilla-fedavg-bernoulli": {"clients_per_round": None, "participation": 0.4},
    "ablation-top_down": {"policy": "top_down", "top_down": {"gu_ratio": 0.5}},
    "ablation-fixed_head": {"policy": "fixed_head"},
    "ablation-fixed_last_two": {"policy": "fixed_last_two"},
    "ablation-fixed_top": {"policy": "fixed_top", "fixed_top": {"fixed_units": 3}},
    "fedbug-mean-of-local-models": {**GU, "evaluation": "mean_of_local_models"},
    "freezefl-freezing": {**SIM, "method": "freezing", "local_steps": None, "local_epochs": 2},
    "freezefl-freezing_cs": {
        **SIM,
        "method": "freezing_cs",
        "local_steps": None,
        "local_epochs": 2,
    },
    "freezefl-freezefl": {
        **SIM,
        "method": "freezefl",
        "local_steps": None,
        "local_epochs": 2,
        "rounds": 3,
        "reputation": {"warm_restart": 2},
    },
    "freezefl-probe-restart": {
        **SIM,
        "method": "freezing",
        "local_steps": None,
        "local_epochs": 2,
        "freezefl": {"probe": "restart"},
    },
    "fjord": {**SIM, "method": "fjord"},
    "fjord_cs": {**SIM, "method": "fjord_cs"},
    "rbcsf": {**SIM, "method": "rbcsf"},
    "sim-fedavg-measured-flops": {**SIM, "algorithm": "fedavg"},
    **{f"pfl-{a}": {**PFL, "algorithm": a} for a in ("fedper", "lg_fedavg", "fedrep")},
    "pfl-fedrod": {**PFL, "algorithm": "fedrod"},
    "pfl-fedbabu": {**PFL, "algorithm": "fedbabu"},
    "fedseq-vanilla": {**PFL, "method": "fedseq-vanilla", "sublayers": 2, "rounds": 3},
    "fedseq-anti": {**PFL, "method": "fedseq-anti", "sublayers": 2, "rounds": 3},
    "fedrod-global-acc-client": {"algorithm": "fedavg", "pfl_test": "matched"},
    "processes-feddyn": {**GU, "algorithm": "feddyn", "executor": "processes", "workers": 2},
    "fedprox-adam-clip": {
        **GU,
        "algorithm": "fedprox",
        "optimizer": "adam",
        "clip_grad_norm": 1.0,
        "lr": 0.01,
    },
}


def family_config(name: str) -> Any:
    doc = {**BASE, **FAMILIES[name]}
    return load_config(None, doc={k: v for k, v in doc.items() if v is not None})


def _records_sha(records: list[dict[str, Any]]) -> str:
    kept = without_timing(records)
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def _fingerprint(w: torch.Tensor) -> list[float]:
    w = w.double()
    return [float(w.sum()), float(w.norm()), float(w[::97].sum())]


def measure(name: str) -> dict[str, Any]:
    threads = torch.get_num_threads()
    try:
        res = run_experiment(family_config(name))
    finally:
        torch.set_num_threads(threads)
    out = {
        "weights_sha256": weights_sha256(res.weights),
        "records_sha256": _records_sha(res.records),
        "fingerprint": _fingerprint(res.weights),
    }
    if "pfl" in res.summary:
        pfl = res.summary["pfl"]
        out["pfl"] = [pfl["before_ft"]["mean"], pfl["after_ft"]["mean"]]
    return out


def _capability() -> str:
    return str(torch.backends.cpu.get_cpu_capability())


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_numbers_are_unchanged(name):
    golden = _golden()
    want = golden["families"][name]
    got = measure(name)
    if golden["cpu_capability"] == _capability():
        assert got["weights_sha256"] == want["weights_sha256"], f"{name}: final weights moved"
        assert got["records_sha256"] == want["records_sha256"], f"{name}: round records moved"
    else:  # another kernel set: equal to float32 rounding
        for a, b in zip(got["fingerprint"], want["fingerprint"]):
            assert math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4), name
    if "pfl" in want:
        assert got["pfl"] == pytest.approx(want["pfl"], abs=1e-6)


def test_every_family_is_recorded():
    assert set(_golden()["families"]) == set(FAMILIES)


def _write() -> None:
    families = {}
    for name in sorted(FAMILIES):
        families[name] = measure(name)
        print(name, families[name]["weights_sha256"][:16], flush=True)
    doc = {"cpu_capability": _capability(), "torch": torch.__version__, "families": families}
    GOLDEN.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_golden.py --write")
    _write()
