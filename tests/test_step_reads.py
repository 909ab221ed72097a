"""A client's local training reads no tensor's value back to the host (no ``.item()``, no
``float(t)``, no ``if t:``, no data-dependent shape such as ``nonzero`` or ``x[mask]``), for
every algorithm and every policy. On a GPU each such read makes the host wait for the device's
queue, so the step's Python no longer runs ahead of its kernels and a launch-bound step
(workload W's) gets slower by the whole of its host time. Checked here on the CPU, where the
same operations are dispatched (``torch.cuda.set_sync_debug_mode`` needs a GPU): what runs
between a client's opening and its result, in the second round (the first builds caches); under
the cohort executor, its group steps and each client's next step.

The width methods are left out: their reads are of host tensors, made once a client and
cached (HeteroFL's and FedRolex's sub-model masks and index sets), or a draw from the
client's CPU generator (Fjord's width a step), which wait for no device. A copy of a host
tensor to the device (FedROD's class counts were, every step) is not dispatched on the CPU and
not seen here: ``tests/test_cuda.py``'s no-wait tests see those on a GPU."""

from __future__ import annotations

import traceback
from collections import Counter
from typing import Any

import pytest
import torch
from executor_checks import after_first_round, cohort_steps_after_first_round, local_round
from test_cohort import pair_config
from torch.utils._python_dispatch import TorchDispatchMode

from fedbug.algorithms import ALGORITHMS
from fedbug.engine import client, run_experiment
from fedbug.errors import ConfigError
from fedbug.policies import POLICIES

#: operations that hand a tensor's value to the host (on a GPU: a wait for the device), or
#: whose output's size depends on the values (the host waits to learn it)
READS = {
    "aten._local_scalar_dense.default",  # .item(), float(t), int(t), bool(t)
    "aten.is_nonzero.default",
    "aten.nonzero.default",
    "aten.masked_select.default",
    "aten.equal.default",
    "aten.allclose.default",
    "aten._unique.default",
    "aten._unique2.default",
    "aten.unique_dim.default",
    "aten.unique_consecutive.default",
    "aten.repeat_interleave.Tensor",
}
#: indexing that reads its indices' values when one of them is a mask (x[mask])
MASKABLE = {"aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default"}
#: algorithms whose reads are of host tensors (see the module's docstring)
HOST_READS = {"heterofl", "fedrolex", "fjord"}


class Reads(TorchDispatchMode):
    """The reads dispatched inside it, each with the library's innermost calling line."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[tuple[str, str]] = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if str(func) in READS or (str(func) in MASKABLE and masked(args)):
            ours = [f for f in traceback.extract_stack() if "src/fedbug" in f.filename]
            where = f"{ours[-1].filename.split('src/')[-1]}:{ours[-1].lineno}" if ours else "?"
            self.seen[str(func), where] += 1
        return func(*args, **(kwargs or {}))


def masked(args: Any) -> bool:
    """Whether an indexing call's indices (its second argument) hold a boolean mask."""
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ())


def matrix(**over: Any) -> list[tuple[str, str]]:
    """Each algorithm without a policy, and each policy under FedAvg (where the pair is valid,
    with ``over``)."""
    out = [(a, "none") for a in ALGORITHMS.names() if a not in HOST_READS]
    out += [("fedavg", p) for p in POLICIES.names() if p != "none"]
    valid = []
    for a, p in out:
        try:
            pair_config(a, p, **over)
        except ConfigError:
            continue
        valid.append((a, p))
    return valid


@pytest.mark.parametrize("algorithm, policy", matrix())
def test_local_training_reads_no_tensor_value(algorithm, policy, monkeypatch):
    reads = Reads()
    watched = after_first_round(monkeypatch, client.LocalRound, "train", local_round, lambda: reads)
    cfg = pair_config(algorithm, policy)
    run_experiment(cfg.model_copy(update={"rounds": max(2, cfg.rounds)}))
    assert watched[0] > 0
    assert not reads.seen, dict(reads.seen)


@pytest.mark.parametrize("algorithm, policy", matrix(executor="cohort"))
def test_the_cohort_executors_steps_read_no_tensor_value(algorithm, policy, monkeypatch):
    reads = Reads()
    watched = cohort_steps_after_first_round(monkeypatch, lambda: reads)
    cfg = pair_config(algorithm, policy, executor="cohort")
    run_experiment(cfg.model_copy(update={"rounds": max(2, cfg.rounds)}))
    assert watched() > 0
    assert not reads.seen, dict(reads.seen)


def test_the_check_sees_a_read():
    """The mode records each read (so the check above can fail)."""
    reads = Reads()
    x = torch.arange(3)
    with reads:
        float(torch.ones(2).sum())
        x.nonzero()
        x[x > 0]
        x[torch.tensor([0, 2])]  # integer indices: no read
    assert sum(reads.seen.values()) == 3
