"""The refusals of configs that ``flower.secagg`` (secure aggregation by Flower's own SecAgg+,
Bell et al. 2020) cannot serve. Its options are
:class:`fedbug.integrations.flower.secagg_params.SecAggParams`; the mechanism is
:mod:`fedbug.integrations.flower.secagg`.

Under ``flower.secagg`` the server learns the round's *sum* only: each client sends one
fixed-length vector (its weighted delta over all shared units, zeros where it sent nothing, and a
per-unit indicator), masked by SecAgg+. A config that needs any one client's update at the
server is refused here, one line each.
"""

from __future__ import annotations

import inspect
from typing import Any

from fedbug.algorithms import ALGORITHMS
from fedbug.selection import SELECTIONS
from fedbug.selection.base import Selection

#: virtual SuperNodes a simulation starts by default, at most (launch.POOL)
_SIMULATION_POOL = 16


def most_selected(cfg: Any) -> int:
    """The most clients one round can select."""
    return cfg.clients_per_round if cfg.clients_per_round is not None else cfg.num_clients


def _reads_clients(selection: type[Selection]) -> bool:
    """Whether a selection reads what each client produced (it overrides ``update``)."""
    return inspect.getattr_static(selection, "update") is not Selection.__dict__["update"]


def secagg_incompatibility(cfg: Any) -> str | None:
    """Why ``cfg``'s ``flower.secagg`` block cannot be honoured (None: it can, or there is
    none)."""
    sa = cfg.flower.secagg
    if sa is None:
        return None
    if not cfg.executor.startswith("flower"):
        return (
            f"flower.secagg: runs Flower's SecAgg+, which executor {cfg.executor} does not use; "
            "set executor: flower-simulation or flower-deployment, or remove flower.secagg"
        )
    if cfg.dp is not None:
        return (
            "flower.secagg: the server sees only the sum of the updates, and dp: clips each "
            "update on receipt at the server; remove one of them"
        )
    if cfg.record_updates:
        return (
            "record_updates: under flower.secagg the server never sees one client's update; "
            "remove record_updates"
        )
    if ALGORITHMS.get(cfg.algorithm).sends_sub_models:
        return (
            f"flower.secagg: algorithm {cfg.algorithm} sends a sub-model (a subset of each "
            "unit's entries, averaged entry by entry), and SecAgg+ sums whole units; remove "
            "flower.secagg for it"
        )
    if cfg.evaluation == "mean_of_local_models":
        return (
            "evaluation: mean_of_local_models needs each client's model, which the server "
            "cannot see under flower.secagg; use evaluation: global"
        )
    sel = cfg.resolved_selection()
    if _reads_clients(SELECTIONS.get(sel)):
        return (
            f"selection {sel} reads each client's update or figures, which the server cannot "
            "see under flower.secagg; use selection uniform or bernoulli"
        )
    return _size_incompatibility(cfg, sa)


def _size_incompatibility(cfg: Any, sa: Any) -> str | None:
    """Rounds too small for SecAgg+, or too large for its modulus or the simulation's nodes."""
    n = most_selected(cfg)
    if cfg.clients_per_round == 1:
        return "flower.secagg: SecAgg+ needs at least 2 clients a round; raise clients_per_round"
    if n * sa.quantization_range >= sa.modulus_range:
        return (
            f"flower.secagg: {n} clients' sums of values quantised to {sa.quantization_range} "
            f"levels overflow modulus_range {sa.modulus_range}; lower quantization_range below "
            f"{sa.modulus_range // n} (or select fewer clients a round)"
        )
    if cfg.executor == "flower-simulation":
        nodes = cfg.flower.supernodes or min(cfg.num_clients, _SIMULATION_POOL)
        if nodes < n:
            return (
                f"flower.secagg: each of a round's clients needs its own SuperNode, and a round "
                f"can select {n} clients on {nodes}; set flower.supernodes: {n}"
            )
    return None
