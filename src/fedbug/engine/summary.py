"""A run's summary: its final figures, totals and provenance."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from fedbug.config import BaseConfig
from fedbug.core.device import describe
from fedbug.errors import DivergenceError, ShortRoundError
from fedbug.results import environment

if TYPE_CHECKING:
    from fedbug.engine.experiment import Experiment


def weights_sha256(weights: Tensor) -> str:
    """SHA-256 of the flat float32 weights' bytes: equal hashes, bitwise equal models."""
    return hashlib.sha256(
        weights.detach().to(torch.float32).contiguous().numpy().tobytes()
    ).hexdigest()


def make_summary(
    cfg: BaseConfig,
    records: list[dict[str, Any]],
    chash: str,
    seconds: float,
    exp: Experiment,
    clients: dict[str, Any],
    weights: Tensor,
) -> dict[str, Any]:
    """summary.json of a run that recorded ``records`` in ``seconds``, its keys in their order:
    status (``completed`` once the last round is recorded, else ``partial``), final and best
    figures, totals, provenance, the simulated system's ``clients`` and the final ``weights``'
    hash. A stopped run's status and cause are :func:`stopped_fields`'; a personalized run's
    fine-tuned figures follow as ``pfl``."""
    task = exp.task
    key = f"test_{task.headline}"
    evaluated = [r for r in records if r.get(key) is not None]
    last = evaluated[-1] if evaluated else None
    pick = max if task.higher_is_better else min
    classification = key == "test_acc"
    # rounds not aggregated (too few valid updates, on_short_round: skip): listed where any
    skipped = [r["round"] for r in records if r.get("aggregated", True) is False]
    return {
        "name": cfg.name,
        "status": "completed" if records and records[-1]["round"] == cfg.rounds else "partial",
        "seed": cfg.seed,
        "config_hash": chash,
        "rounds": records[-1]["round"] if records else 0,
        "final_acc": last["test_acc"] if last and classification else None,
        "final_loss": last["test_loss"] if last else None,
        "best_acc": max((r["test_acc"] for r in evaluated), default=None)
        if classification
        else None,
        "metric": task.headline,
        "final": last[key] if last else None,
        "best": pick((r[key] for r in evaluated), default=None),
        "task": task.describe(),
        **exp.provenance(),
        "num_clients": exp.num_clients,
        "num_units": exp.space.num_units,
        "units": [u.name for u in exp.units],
        "num_params": sum(exp.space.unit_param_numel),
        "total_flops": sum(r["flops"] for r in records),
        "total_bytes_up": sum(r["bytes_up"] for r in records),
        "total_bytes_down": sum(r["bytes_down"] for r in records),
        "client_rounds": sum(r["num_clients"] for r in records),
        **(peak_mem(records) if cfg.count_flops else {}),
        "seconds": seconds,
        "environment": {
            **environment(),
            "device": describe(exp.device),
            "data_on_device": exp.data_placement,
            **({"gpu_kernels": exp.kernels} if exp.kernels else {}),
        },
        "config": cfg.model_dump(mode="json"),
        **({"skipped_rounds": skipped} if skipped else {}),
        "clients": clients,
        "weights_sha256": weights_sha256(weights),
    }


def peak_mem(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's costliest client step: the largest ``peak_mem_bytes`` of the rounds and its
    ``peak_mem_parts`` (None each where no round counted one)."""
    counted = [r for r in records if r.get("peak_mem_bytes") is not None]
    top = max(counted, key=lambda r: r["peak_mem_bytes"], default=None)
    if top is None:
        return {"peak_mem_bytes": None, "peak_mem_parts": None}
    return {"peak_mem_bytes": top["peak_mem_bytes"], "peak_mem_parts": top["peak_mem_parts"]}


def stopped_fields(
    error: DivergenceError | ShortRoundError, short_round: dict[str, Any] | None
) -> dict[str, Any]:
    """A stopped run's ``status`` (in place of ``completed`` or ``partial``) and what stopped it:
    ``diverged`` with the ``divergence`` (round, client or None, reason), or ``stopped`` with
    the ``short_round`` block (the round's count and the message; empty where none is known)."""
    if isinstance(error, DivergenceError):
        divergence = {"round": error.round, "client": error.client, "reason": error.reason}
        return {"status": "diverged", "divergence": divergence}
    return {"status": "stopped", "short_round": short_round or {}}
