"""The reference's side of the APF pair: chenc10/APF_Release's own ``APF_Interlayer``, driven as
its ``worker_process.py`` and ``Sync_Manager.try_sync_model`` drive it, without
``torch.distributed``.

One interlayer per worker, each over its own copy of the model and its own SGD (no momentum, as
``model_manager.py``); every local step: ``zero_grad``, the loss (``CrossEntropyLoss``),
``backward``, ``step``, then ``generate_tensor_list_to_transmit(iter_id)`` (iter_id counting
from 1). At ``iter_id % sync_frequency == 0`` each worker returns its active entries; their sum
in worker order divided by the number of workers (``dist.all_reduce(SUM)`` then ``/ world_size``)
is handed to every worker's ``restore_model_from_tensor_list_received``, which refreshes the
freezing status. After every round the first worker's mask, lengths, thaw rounds, threshold and
weights are kept, and the others are checked to hold the same.

Stand-ins (the least that lets the code run here): (1) ``active_mask.bool()`` after
construction (the code builds it as uint8; torch 2 refuses a uint8 mask in ``masked_select``);
(2) no ``Sync_Manager`` (its ``init_dist`` opens a process group; the all-reduce is the sum
above); (3) for commit b67fd17, an empty ``rpyc`` module (imported at the top for its
``Sync_Manager``, which is not used); (4) for random freezing, the module's ``torch.rand``
returns fedbug's draws of the round, and ``randomly_freeze_active_params`` takes (and drops) the
argument the release passes it (as released it raises a TypeError); (5) ``freezing_lengths`` as
a tensor whose ``/`` truncates on integers, as torch 1.0's did (the README's torch 1.0.0): the
release halves the lengths with ``/ 2``, which torch 2 makes a float division and then refuses to
store into the int tensor (b67fd17 writes ``// 2``). The interlayers' logging is captured.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import io
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

Draws = Callable[[int, int], Tensor]  # (round, n) -> n uniforms in [0, 1)


@dataclass
class ReferenceRun:
    names: list[str]  # the model's parameter names, in the order the interlayer flattens them
    rounds: list[dict[str, Any]] = field(default_factory=list)


def load(path: str | Path) -> types.ModuleType:
    """The checkout's ``sync_manager`` module (a fresh copy each call)."""
    file = Path(path) / "sync_manager.py"
    if not file.is_file():
        raise SystemExit(f"{path}: not a checkout of chenc10/APF_Release (no sync_manager.py)")
    if "import rpyc" in file.read_text():
        sys.modules.setdefault("rpyc", types.ModuleType("rpyc"))  # stand-in 3
    spec = importlib.util.spec_from_file_location("apf_sync_manager", file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with contextlib.redirect_stdout(io.StringIO()):
        spec.loader.exec_module(module)
    return module


class _Torch10Int(torch.Tensor):
    """Stand-in 5: an integer tensor whose ``/`` truncates, as torch 1.0's did."""

    def __truediv__(self, other: Any) -> Tensor:
        if self.is_floating_point():
            return super().__truediv__(other)
        return torch.div(self, other, rounding_mode="trunc")


class _TorchWithDraws:
    """The ``torch`` the module sees: torch itself, but ``rand`` gives the draws of ``round``."""

    def __init__(self, draws: Draws) -> None:
        self.draws, self.round = draws, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)

    def rand(self, *size: Any) -> Tensor:
        shape = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else size
        n = 1
        for s in shape:
            n *= int(s)
        return self.draws(self.round, n).view(shape)


def _with_draws(sm: types.ModuleType, draws: Draws) -> _TorchWithDraws:
    """Stand-in 4: the module's torch replaced, the release's call fixed."""
    proxy = _TorchWithDraws(draws)
    sm.torch = proxy
    cls = sm.APF_Interlayer
    orig = cls.randomly_freeze_active_params

    @functools.wraps(orig)
    def randomly_freeze(self: Any, *dropped: Any) -> Any:
        return orig(self)

    cls.randomly_freeze_active_params = randomly_freeze
    return proxy


def _view(inter: Any, model: nn.Module) -> dict[str, Any]:
    return {
        "active": inter.active_mask.bool().clone(),
        "length": inter.freezing_lengths.as_subclass(Tensor).clone(),
        "thaw": inter.fc_round_ids_to_unfreeze_params.clone(),
        "threshold": float(inter.stable_threshold),
        "check": int(inter.fc_round_id),
        "weights": torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone(),
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(torch.equal(a[k], b[k]) if isinstance(a[k], Tensor) else a[k] == b[k] for k in a)


def run(
    path: str | Path,
    model: nn.Module,
    data: list[tuple[Tensor, Tensor]],
    hyper: dict[str, Any],
    sync_frequency: int,
    rounds: int,
    lr: float,
    weight_decay: float,
    draws: Draws | None = None,
    tighten_at: float = 0.8,
) -> ReferenceRun:
    """``rounds`` synchronisations of len(data) workers, each starting from ``model``'s weights.
    ``hyper``: the interlayer's ``apf_hyperparams`` (``ema_alpha``, ``stable_threshold``,
    ``enable_random_freezing``, ``freezing_check_frequency``); ``tighten_at``: its
    ``tighter_stable_criterion_threshold`` (set in its constructor: 0.8); ``draws``: fedbug's
    random-freezing draws (stand-in 4), None without random freezing."""
    sm = load(path)
    proxy = _with_draws(sm, draws) if draws is not None else None
    models = [copy.deepcopy(model) for _ in data]
    opts = [torch.optim.SGD(m.parameters(), lr=lr, weight_decay=weight_decay) for m in models]
    loss = nn.CrossEntropyLoss()
    with contextlib.redirect_stdout(io.StringIO()):
        inters = [sm.APF_Interlayer(m, sync_frequency, dict(hyper)) for m in models]
    for it in inters:
        it.active_mask = it.active_mask.bool()  # stand-in 1
        it.tighter_stable_criterion_threshold = tighten_at
        it.freezing_lengths = it.freezing_lengths.as_subclass(_Torch10Int)  # stand-in 5
    out = ReferenceRun([n for n, _ in model.named_parameters()])
    iter_id = 0
    for r in range(1, rounds + 1):
        for _ in range(sync_frequency):
            iter_id += 1
            sent = []
            for m, opt, it, (x, y) in zip(models, opts, inters, data):
                opt.zero_grad()
                loss(m(x), y).backward()
                opt.step()
                sent.append(it.generate_tensor_list_to_transmit(iter_id))
        assert all(len(s) == 1 for s in sent), "a round must end on a synchronisation"
        total = functools.reduce(lambda a, b: a + b, [s[0] for s in sent])
        received = total / len(inters)
        if proxy is not None:
            proxy.round = r
        with contextlib.redirect_stdout(io.StringIO()):
            for it in inters:
                it.restore_model_from_tensor_list_received([received.clone()])
        views = [_view(it, m) for it, m in zip(inters, models)]
        if not all(_same(views[0], v) for v in views[1:]):
            raise AssertionError(f"round {r}: the reference's workers hold different states")
        out.rounds.append(views[0])
    return out
