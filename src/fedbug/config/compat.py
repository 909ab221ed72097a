"""The one place that refuses a config whose pieces cannot run together, each refusal saying why.

Every piece answers for itself (``check_config`` on the algorithm, the freeze policy and the
selection, see their bases); this module asks them in order and adds what concerns the config as
a whole: an options block of a method the config does not use, set to anything but its defaults,
has no effect, which is refused naming the method that would use it (a block at its defaults is
harmless: a resolved config, which lists every block, reads back). A config with a ``grid`` is a
sweep's base: it may hold the blocks of every method its cells use (the sweep checks them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from fedbug.algorithms import ALGORITHMS
from fedbug.config.cohort import cohort_incompatibility
from fedbug.config.dp import dp_incompatibility, dp_sgd_incompatibility
from fedbug.config.secagg import secagg_incompatibility
from fedbug.models.adapters import adapter_head_incompatibility
from fedbug.policies import POLICIES
from fedbug.policies.schedule import unfreeze_rounds_problem
from fedbug.selection import SELECTIONS

#: Blocks other runs of the same sweep use: set while a sweep validates its cells, so a base
#: config may hold the options of every method its grid compares.
_USED_ELSEWHERE: ContextVar[frozenset[str]] = ContextVar("used_elsewhere", default=frozenset())


@contextlib.contextmanager
def blocks_used_elsewhere(names: frozenset[str]) -> Iterator[None]:
    """Within this block, options blocks named in ``names`` are not refused as unused."""
    token = _USED_ELSEWHERE.set(names)
    try:
        yield
    finally:
        _USED_ELSEWHERE.reset(token)


def owners() -> dict[str, tuple[str, str]]:
    """Every options block: its name -> (kind, method) of the one method that uses it."""
    out: dict[str, tuple[str, str]] = {}
    for kind, registry in (
        ("algorithm", ALGORITHMS),
        ("policy", POLICIES),
        ("selection", SELECTIONS),
    ):
        for name, cls in registry.items():
            if cls.params_cls is not None:
                out[name] = (kind, name)
    return out


def used_blocks(cfg: Any) -> set[str]:
    """The options blocks that the methods ``cfg`` chooses read."""
    return {cfg.algorithm, cfg.policy, cfg.resolved_selection()}


def incompatibility(cfg: Any) -> str | None:
    """Why ``cfg`` cannot run, or None: the first reason found, the checks asked in order
    (looked up when called, so a test may stand one in)."""
    checks: tuple[Callable[[Any], str | None], ...] = (
        _flower_evaluation,
        _system_flops,
        _pieces,
        _personalized_task,
        targets_incompatibility,
        _adapter_head,
        dp_incompatibility,
        dp_sgd_incompatibility,
        cohort_incompatibility,
        secagg_incompatibility,
        global_model_incompatibility,
        device_incompatibility,
        _schedule,
        unused_block_incompatibility,
        _participation,
    )
    return next((r for r in (check(cfg) for check in checks) if r is not None), None)


def _flower_evaluation(cfg: Any) -> str | None:
    if cfg.executor.startswith("flower") and cfg.evaluation == "personalized":
        return (
            f"executor {cfg.executor} keeps personal model parts on the nodes, so the server "
            "cannot run evaluation: personalized; use executor: sequential"
        )
    return None


def _system_flops(cfg: Any) -> str | None:
    if cfg.system is not None and not cfg.count_flops:
        return "a system: block times clients from their FLOPs; keep count_flops"
    return None


def _pieces(cfg: Any) -> str | None:
    """The chosen algorithm's, freeze policy's and selection's own ``check_config``."""
    for piece in (
        ALGORITHMS.get(cfg.algorithm),
        POLICIES.get(cfg.policy),
        SELECTIONS.get(cfg.resolved_selection()),
    ):
        reason = piece.check_config(cfg)
        if reason is not None:
            return reason
    return None


def _personalized_task(cfg: Any) -> str | None:
    if cfg.evaluation == "personalized" and cfg.task != "classification":
        return (
            f"evaluation: personalized scores each client's accuracy on class labels, which task "
            f"{cfg.task} does not give; use evaluation: global (or mean_of_local_models)"
        )
    return None


def _adapter_head(cfg: Any) -> str | None:
    return adapter_head_incompatibility(cfg, ALGORITHMS.get(cfg.algorithm))


def global_model_incompatibility(cfg: Any) -> str | None:
    """An evaluation of the server's model under an algorithm that keeps part of every model on
    its clients (``has_global_model`` False: the server's weights are no model)."""
    if cfg.evaluation == "personalized" or ALGORITHMS.get(cfg.algorithm).has_global_model:
        return None
    return (
        f"evaluation: {cfg.evaluation} needs a global model, and algorithm {cfg.algorithm} keeps "
        "part of every model on its client, so there is no global model to evaluate; use "
        "evaluation: personalized"
    )


def device_incompatibility(cfg: Any) -> str | None:
    """A device named for ``executor: processes``, whose workers train on the CPU (``auto``
    means the CPU there)."""
    if cfg.executor == "processes" and cfg.device not in ("auto", "cpu"):
        return (
            f"executor: processes runs its workers on the CPU, not device: {cfg.device}; use "
            "device: cpu (or auto), or executor: sequential (one process drives the device)"
        )
    return None


def _schedule(cfg: Any) -> str | None:
    """FedSeq's unfreeze rounds, as far as the config decides them (their count: the model)."""
    if cfg.schedule == "none" or cfg.unfreeze_rounds is None:
        return None
    return unfreeze_rounds_problem(cfg.unfreeze_rounds, cfg.rounds)


def unused_block_incompatibility(cfg: Any) -> str | None:
    """An options block, off its defaults, of a method neither ``cfg`` nor (in a sweep) another
    cell uses."""
    used = used_blocks(cfg) | _USED_ELSEWHERE.get()
    chosen = {"algorithm": cfg.algorithm, "policy": cfg.policy}
    chosen["selection"] = cfg.resolved_selection()
    for block, (kind, method) in sorted(owners().items()):
        value = cfg.options(block)
        if block not in used and value is not None and value != type(value)():
            return (
                f"{block}: has no effect under {kind}: {chosen[kind]}; it holds the options of "
                f"{kind} {method} (remove the block, set {kind}: {method}, or compare methods "
                f"with fedbug sweep -g {kind}=...)"
            )
    return None


def _participation(cfg: Any) -> str | None:
    fixed_count = cfg.clients_per_round is not None and cfg.resolved_selection() != "bernoulli"
    if fixed_count and cfg.participation != type(cfg).model_fields["participation"].default:
        return (
            "participation has no effect when clients_per_round picks a fixed number of "
            "clients; remove one of them (-s participation=null)"
        )
    return None


def targets_incompatibility(cfg: Any) -> str | None:
    """Why ``targets: every`` cannot run with ``cfg``: it trains a causal LM on the token after
    each position, which only ``task: next_token`` scores, and its classifier then reads every
    position's features, not the one row a sample that a features-reading algorithm takes."""
    if cfg.targets == "last":
        return None
    if cfg.task != "next_token":
        return (
            f"targets: every trains on the token after each position, which task {cfg.task} "
            "does not score; use task: next_token, or remove targets"
        )
    if ALGORITHMS.get(cfg.algorithm).needs_features:
        return (
            f"targets: every gives the classifier every position's features, and algorithm "
            f"{cfg.algorithm} reads one feature row a sample; use targets: last"
        )
    return None


def check_compatible(cfg: Any) -> None:
    """Raise ``ValueError`` (the config's one-line message) when ``cfg`` cannot run."""
    reason = incompatibility(cfg)
    if reason is not None:
        raise ValueError(reason)
