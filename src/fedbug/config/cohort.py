"""The ``cohort:`` block (``executor: cohort``: a round's clients trained together as one
vectorised step, :mod:`fedbug.engine.executors.cohort`), and the refusals of configs whose
local training it cannot vectorise exactly. Pydantic only, no torch: the model's
checks (buffers, dropout) run where the model is built."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fedbug.algorithms import ALGORITHMS

#: Algorithm hooks that act inside a local step on the one runtime's flat vectors (or open a
#: per-client session of their own): not vectorised yet, so refused under the cohort executor.
_STEP_HOOKS = ("start_client", "extra_loss", "adjust_grads", "adjust_grads_after_clipping")
#: the gradient hooks an algorithm may write for stacked clients (``vectorised_step``)
_VECTORISABLE = ("extra_loss", "adjust_grads", "adjust_grads_after_clipping")


class CohortParams(BaseModel):
    """Options of ``executor: cohort``."""

    model_config = ConfigDict(extra="forbid")
    max_clients: int | None = Field(
        None,
        ge=1,
        le=1_000_000,
        description="clients trained together at most (a round's clients go in chunks of this "
        "many; the memory of a chunk grows with it); default: the whole round",
    )
    memory_mb: float | None = Field(
        None,
        gt=0,
        le=1e9,
        description="a memory budget for a chunk, in MiB: as many clients as a full step's "
        "counted memory (activations, gradients) and their stacked vectors fit, at least one",
    )
    cuda_graphs: bool = Field(
        False,
        description="on a CUDA device: capture the vectorised gradient in a CUDA graph per "
        "group shape (units, clients, batch shapes and layout) at its second use and replay it, "
        "one launch a step instead of the gradient's kernels; the eager numbers; at most 32 "
        "graphs, writing their gradients into one buffer; their working memory (one pool) "
        "not counted by memory_mb",
    )
    gradient: Literal["vmap", "streams"] = Field(
        "vmap",
        description="how a group's gradients are computed: vmap, one vectorised map over the "
        "clients (a grouped kernel per layer); streams, each client's own gradient with the "
        "ordinary kernels, clients side by side on up to 16 CUDA streams (one after another "
        "on the CPU), meant with cuda_graphs, where the streams become one graph's parallel "
        "branches; the same numbers within float32 rounding",
    )


def _vectorised(alg: type, hook: str) -> bool:
    """Whether the class that defines ``hook`` for ``alg`` declares ``vectorised_step`` in its
    own body (a term written for the cohort executor), for the loss and gradient hooks."""
    if hook not in _VECTORISABLE:
        return False
    owner = next(c for c in alg.__mro__ if hook in vars(c))
    return bool(vars(owner).get("vectorised_step", False))


def cohort_incompatibility(cfg: Any) -> str | None:
    """Why ``cfg``'s local training cannot run under ``executor: cohort`` (None: it can, or
    another executor is chosen)."""
    if cfg.executor != "cohort":
        return None
    fix = "or use executor: sequential"
    alg = ALGORITHMS.get(cfg.algorithm)
    hooks = [h for h in _STEP_HOOKS if alg.overrides(h) and not _vectorised(alg, h)]
    if hooks:
        return (
            f"executor: cohort trains clients as one vectorised step, and algorithm "
            f"{cfg.algorithm} acts inside each client's step ({', '.join(hooks)}), which is not "
            f"vectorised yet; use one whose gradient terms are (fedavg, fedprox, feddyn, scaffold, "
            f"...) {fix}"
        )
    if cfg.cohort.cuda_graphs and not str(cfg.device).startswith(("cuda", "auto")):
        return (
            f"cohort: {{cuda_graphs: true}} captures CUDA graphs, and device: {cfg.device} has "
            "none; set device: cuda (or auto, on a machine with a CUDA GPU) or cuda_graphs: false"
        )
    if cfg.precision not in ("fp32", "tf32"):  # tf32: float32 tensors, TensorFloat-32 kernels
        return (
            f"executor: cohort runs in float32, not precision {cfg.precision}; use precision: "
            f"fp32 (or tf32 on a GPU), {fix}"
        )
    if getattr(cfg, "dp_sgd", None) is not None:
        return (
            f"executor: cohort does not compute DP-SGD's per-sample gradients; remove dp_sgd, {fix}"
        )
    return None


#: how :func:`unused_cohort_block`'s warning starts (a warnings filter's ``message``)
UNUSED_COHORT = "cohort: is read only by executor: cohort"


def unused_cohort_block(cfg: Any) -> str | None:
    """The warning where ``cfg`` sets ``cohort:`` options (off their defaults: a resolved
    config lists the block at its defaults) and runs another executor, which reads none of
    them; None otherwise. A warning, not a refusal: a sweep over executors shares one block."""
    if cfg.executor == "cohort" or cfg.cohort == CohortParams():
        return None
    return (
        f"{UNUSED_COHORT}; this run's executor, {cfg.executor}, ignores it (remove the block, "
        "or set executor: cohort)"
    )
