"""``record_updates: [round, ...]``: in those rounds, write what the server receives from each
client into the run folder (:mod:`fedbug.results.updates`), for the attack to reconstruct, with
the client's true inputs of the round kept beside it for scoring only.

The true inputs are the samples the client's local steps drew, each once in the order first
drawn (a step's are its batch; with the usual shuffle, the first epoch's permutation up to the
steps taken), as the client's :class:`~fedbug.engine.client.LocalRound` drew them: its round is
replayed on a runtime of the recorder's own (:func:`~fedbug.engine.client.trained_batches`), so
whatever draws between the batches (DP-SGD's Poisson batches and noise, an algorithm's draws, a
policy's restart) is drawn again. They are prepared as training prepares them (augmentation is
not: the inputs recorded are the samples before it). Nothing is recorded unless asked for."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedbug.core.protocol import ClientResult, ClientTask
from fedbug.engine.client import ClientRuntime, first_drawn, trained_batches
from fedbug.results.updates import write_global, write_update


def sent_units(res: ClientResult) -> list[int]:
    """The units whose delta the server takes from ``res`` (as the aggregation does)."""
    return [u for u, s in enumerate(res.uploaded) if s]


def true_inputs(
    exp: Any, task: ClientTask, weights: Tensor, state: dict[str, Tensor], rt: ClientRuntime
) -> tuple[Tensor, Tensor]:
    """The (prepared inputs, labels) client ``task.client`` trained on in ``task.round`` from
    ``weights`` and its ``state``: each sample its steps drew once, in the order first drawn."""
    data = exp.client_data(task.client)
    idx = first_drawn(trained_batches(weights, task, data, state, rt)).to(data.x.device)
    x = exp.dataset.prepare(data.x[idx])
    return x.detach().cpu().to(torch.float32), data.y[idx].detach().cpu()


def record_one(
    run: Path, exp: Any, task: ClientTask, res: ClientResult, inputs: tuple[Tensor, Tensor]
) -> None:
    """Write client ``res.client``'s received update and its truth (``inputs``)."""
    space, cfg = exp.space, exp.cfg
    units = sent_units(res)
    delta = res.delta.detach().cpu()
    deltas = {
        name: delta[off : off + n].view(shape)
        for name, is_p, u, off, n, shape in zip(
            space.names, space.is_param, space.unit_of, space.offsets, space.numels, space.shapes
        )
        if is_p and u in units
    }
    x, y = inputs
    meta = {
        "round": task.round,
        "client": res.client,
        "num_samples": res.num_samples,
        "steps": res.steps,
        "lr": task.lr,
        "weight_decay": cfg.weight_decay,
        "momentum": cfg.momentum,
        "augment": exp.dataset.augmentation if cfg.augment == "auto" else cfg.augment,
        "num_images": len(y),
        "units_sent": units,
        "params_sent": sorted(deltas),
        "model": cfg.model,
        "model_options": dict(cfg.model_options),
        "input_shape": list(exp.dataset.input_shape),
        "num_classes": exp.dataset.num_classes,
        "received_names": {
            name: [off, n] for name, off, n in zip(space.names, space.offsets, space.numels)
        },
    }
    write_update(run, meta, deltas, x, y)


def record_stream(
    run: Path,
    exp: Any,
    round: int,
    weights: Tensor,
    tasks: list[ClientTask],
    stream: Iterable[ClientResult],
    states: Mapping[int, dict[str, Tensor]],
) -> Iterator[ClientResult]:
    """``stream`` unchanged, each result written as it passes (the round's weights first),
    its truth from a replay of the client's round from ``weights`` and its state in ``states``
    (the round's, before its results are stored) on a runtime of the recorder's own."""
    write_global(run, round, weights.detach().cpu())
    by_client = {t.client: t for t in tasks}
    rt: ClientRuntime | None = None
    for res in stream:
        rt = rt if rt is not None else exp.make_runtime()
        task = by_client[res.client]
        record_one(run, exp, task, res, true_inputs(exp, task, weights, states[res.client], rt))
        yield res
