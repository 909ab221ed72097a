"""Golden numbers: a short run of every config family gives the final weights (SHA-256) and the
round records recorded in ``golden.json`` before the package was reshaped (issue 14).

A change that moves a number on purpose (a fixed drift) rewrites the file with
``python tests/test_golden.py --write`` and says which family changed and why in its commit.

SHA-256 equality is the promise on one kind of machine: one whose torch does the same arithmetic
(the same kernels, the same blocking for its caches). torch's CPU capability does not tell
that: an Intel Xeon and an AMD EPYC both report AVX512 and round differently. So the file keys
its exact records by a probe of the arithmetic itself (the bits of the families' model
training and evaluating a batch, :func:`kernels`). Every machine checks a fingerprint of how far
the weights moved from their initial values, to a tolerance above the rounding measured between
two kinds of machine; a machine whose probe has a record also checks both SHA-256s (and says
when it has none: ``test_this_machine_has_an_exact_record`` is skipped with the command that
adds one, ``python tests/test_golden.py --add-machine``).

The fingerprint catches a change of more than about 1e-5 in the weights' movement (a 1% change
of lr moves it 1e-3); a smaller one (FedProx's term over these eight steps moves the weights
1e-6 from FedAvg's) only the exact record sees. The formulas themselves are checked by the
hand-worked tests beside each algorithm.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny import without_timing

from fedbug.config import load_config
from fedbug.engine import run_experiment, weights_sha256
from fedbug.engine.client import to_channels_last
from fedbug.engine.experiment import ClientSide
from fedbug.models import DigitsCNN
from fedbug.results import cpu_name

GOLDEN = Path(__file__).with_name("golden.json")
# what an exact record holds of a family; the fingerprint and pfl figures hold for every machine
SHAS = ("weights_sha256", "records_sha256")

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


def _fingerprint(w: torch.Tensor, w0: torch.Tensor) -> list[float]:
    """How far the weights moved: the sum, the norm and a fixed random (+-1) projection of
    w - w0, in float64."""
    d = (w.double() - w0.double()).flatten()
    signs = torch.randint(0, 2, d.shape, generator=torch.Generator().manual_seed(97)) * 2 - 1
    return [float(d.sum()), float(d.norm()), float((d * signs).sum())]


# The fingerprint's tolerance (absolute; the weights move 0.03 to 5 in norm). Measured between an
# Intel Xeon and an AMD EPYC (both AVX512, torch 2.13.0) on the sum of the weights: at most
# 1.4e-6 (fedprox-adam-clip), most families 1e-8. FedDecorr standardises each feature by
# sqrt(var + 1e-8): a feature dead on a batch has a variance of rounding noise, which that
# divides by 1e-4, so other kernels' rounding moves its weights further (1.5e-3).
#: wider where a family's rounding on another CPU's kernels passes 1e-5 (fedprox-adam-clip: 1.4e-5
#: on an AVX2-only AMD EPYC, session 21: Adam's first steps follow the gradient's sign, so they
#: carry rounding in small entries furthest)
TOLERANCE = {"fedbug-feddecorr": 5e-3, "fedprox-adam-clip": 5e-5}


def _close(name: str, got: list[float], want: list[float]) -> bool:
    tol = TOLERANCE.get(name, 1e-5)
    return all(math.isclose(a, b, rel_tol=0, abs_tol=tol) for a, b in zip(got, want, strict=True))


def kernels() -> str:
    """Which arithmetic this machine's torch does: SHA-256 (16 hex digits) of the bits of the
    families' model (digits_cnn, NHWC input as ``memory_format: channels_last`` gives it, one
    thread) training a batch of 16 (forward, backward) and evaluating one of 256 (inference
    mode), with the torch version. Two machines with one probe may still round another operation
    differently (an optimiser's, a loss's): the exact check then fails and says so."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        g = torch.Generator().manual_seed(0)
        model = DigitsCNN((1, 8, 8), 10)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        x = to_channels_last(torch.randn(16, 1, 8, 8, generator=g))
        y = torch.randint(0, 10, (16,), generator=g)
        out = model(x)
        torch.nn.functional.cross_entropy(out, y).backward()
        with torch.inference_mode():
            evaluated = model(to_channels_last(torch.randn(256, 1, 8, 8, generator=g)))
        h = hashlib.sha256(torch.__version__.encode())
        for t in [out.detach(), evaluated, *(p.grad for p in model.parameters())]:
            h.update(t.contiguous().numpy().tobytes())
        return h.hexdigest()[:16]
    finally:
        torch.set_num_threads(threads)


def measure(name: str, device: str = "cpu") -> dict[str, Any]:
    threads = torch.get_num_threads()
    cfg = family_config(name).model_copy(update={"device": device})
    try:
        res = run_experiment(cfg)
        w0 = ClientSide(cfg).initial_weights()
    finally:
        torch.set_num_threads(threads)
    out = {
        "weights_sha256": weights_sha256(res.weights),
        "records_sha256": _records_sha(res.records),
        "fingerprint": _fingerprint(res.weights, w0),
    }
    if "pfl" in res.summary:
        pfl = res.summary["pfl"]
        out["pfl"] = [pfl["before_ft"]["mean"], pfl["after_ft"]["mean"]]
    return out


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def exact() -> dict[str, Any] | None:
    """This machine's exact record, if its kind of arithmetic has one."""
    return _golden()["exact"].get(kernels())


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_numbers_are_unchanged(name, exact):
    want = _golden()["families"][name]
    got = measure(name)
    assert _close(name, got["fingerprint"], want["fingerprint"]), (
        f"{name}: the weights moved (fingerprint {got['fingerprint']}, recorded "
        f"{want['fingerprint']})"
    )
    if exact is not None:
        shas = exact["families"][name]
        why = (
            "within the fingerprint's tolerance but not bit for bit on this machine's kind of "
            "arithmetic: a change below float32 tolerance, or an operation the probe does not "
            "cover that rounds differently here"
        )
        assert got["weights_sha256"] == shas["weights_sha256"], f"{name}: final weights {why}"
        assert got["records_sha256"] == shas["records_sha256"], f"{name}: round records {why}"
    if "pfl" in want:
        assert got["pfl"] == pytest.approx(want["pfl"], abs=1e-6)


#: Families that train on a GPU: all but the worker processes', which are CPU-only.
CUDA_FAMILIES = sorted(n for n in FAMILIES if FAMILIES[n].get("executor") != "processes")
#: On a GPU the families' accuracies may differ by a prediction or two from the CPU's.
CUDA_PFL_TOLERANCE = 0.02


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device, and FEDBUG_TEST_GPU=1 there"
)
@pytest.mark.parametrize("name", CUDA_FAMILIES)
def test_family_on_a_gpu_moves_the_weights_as_on_the_cpu(name):
    """``device: cuda`` (fp32: TensorFloat-32 off) moves the weights as the CPU record does, to
    the fingerprint's tolerance between two kinds of CPU."""
    want = _golden()["families"][name]
    got = measure(name, "cuda")
    worst = max(abs(a - b) for a, b in zip(got["fingerprint"], want["fingerprint"], strict=True))
    print(f"{name}: largest fingerprint difference GPU - CPU record {worst:.2e}")
    assert _close(name, got["fingerprint"], want["fingerprint"]), (
        f"{name} on the GPU: the weights moved otherwise than on the CPU (fingerprint "
        f"{got['fingerprint']}, recorded {want['fingerprint']}, largest difference {worst:.2e})"
    )
    if "pfl" in want:
        assert got["pfl"] == pytest.approx(want["pfl"], abs=CUDA_PFL_TOLERANCE)


def test_every_family_is_recorded():
    golden = _golden()
    assert set(golden["families"]) == set(FAMILIES)
    for record in golden["exact"].values():
        assert set(record["families"]) == set(FAMILIES)


def test_this_machine_has_an_exact_record(exact):
    if exact is None:
        pytest.skip(
            f"golden.json has no exact record for this machine's arithmetic (probe {kernels()}, "
            f"{cpu_name()}): fingerprints checked, SHA-256s not; "
            "`python tests/test_golden.py --add-machine` adds one"
        )


def test_the_probe_is_the_same_in_another_process():
    code = "import test_golden; print(test_golden.kernels())"
    here = Path(__file__).parent
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == kernels()
    assert len(kernels()) == 16


def _exact_record(measured: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "cpu": cpu_name(),
        "families": {n: {k: m[k] for k in SHAS} for n, m in sorted(measured.items())},
    }


def _measure_all() -> dict[str, dict[str, Any]]:
    measured = {}
    for name in sorted(FAMILIES):
        measured[name] = measure(name)
        print(name, measured[name]["weights_sha256"][:16], flush=True)
    return measured


def _save(doc: dict[str, Any]) -> None:
    GOLDEN.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _write() -> None:
    """A new record from this machine alone (the numbers moved on purpose): other machines'
    exact records are dropped (their numbers moved too), each to be added again there."""
    measured = _measure_all()
    families = {n: {k: v for k, v in m.items() if k not in SHAS} for n, m in measured.items()}
    _save(
        {
            "torch": torch.__version__,
            "families": families,
            "exact": {kernels(): _exact_record(measured)},
        }
    )


def _add_machine() -> None:
    """This machine's exact record beside the others, once every fingerprint agrees."""
    doc = _golden()
    measured = _measure_all()
    moved = [
        n
        for n, m in measured.items()
        if not _close(n, m["fingerprint"], doc["families"][n]["fingerprint"])
    ]
    if moved:
        sys.exit(f"fingerprints moved beyond float32 rounding: {', '.join(moved)}; not added")
    probe = kernels()
    record, old = _exact_record(measured), doc["exact"].get(probe)
    if old is not None and old["families"] != record["families"]:
        sys.exit(
            f"this machine's probe {probe} has a record and the numbers differ from it: "
            "the code moved them (then --write, with the reason) or the probe misses an "
            "operation; not added"
        )
    doc["exact"][probe] = record
    _save(doc)


if __name__ == "__main__":
    actions = {"--write": _write, "--add-machine": _add_machine}
    if len(sys.argv) != 2 or sys.argv[1] not in actions:
        sys.exit("usage: python tests/test_golden.py --write | --add-machine")
    actions[sys.argv[1]]()
