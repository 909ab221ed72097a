"""``record_updates: [round, ...]``: in those rounds, write what the server receives from each
client into the run folder (:mod:`fedbug.results.updates`), for the attack to reconstruct, with
the client's true inputs of the round kept beside it for scoring only.

The true inputs are the samples of the client's first local batches, found by drawing the
permutation its training draws first (:func:`~fedbug.engine.client.shuffle_generator`, the
client's first draw for the algorithms that draw nothing when the client opens) and prepared
as training prepares them (augmentation, drawn on the same generator, is not replayed: the
inputs recorded are the samples before it). Nothing is recorded unless asked for."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedbug.core.protocol import ClientResult, ClientTask
from fedbug.engine.client import shuffle_generator
from fedbug.results.updates import write_global, write_update


def sent_units(res: ClientResult) -> list[int]:
    """The units whose delta the server takes from ``res`` (as the aggregation does)."""
    return [u for u, s in enumerate(res.uploaded) if s]


def true_inputs(exp: Any, task: ClientTask, steps: int) -> tuple[Tensor, Tensor]:
    """The (prepared inputs, labels) client ``task.client`` trained on in ``task.round``'s
    first ``steps`` steps (all its samples once they span an epoch)."""
    data = exp.client_data(task.client)
    n, bs = len(data), exp.cfg.batch_size
    gen = shuffle_generator(task.seed, task.round, task.client)
    perm = torch.randperm(n, generator=gen)
    idx = perm[: min(n, steps * bs)].to(data.x.device)
    x = exp.dataset.prepare(data.x[idx])
    return x.detach().cpu().to(torch.float32), data.y[idx].detach().cpu()


def record_one(run: Path, exp: Any, task: ClientTask, res: ClientResult) -> None:
    """Write client ``res.client``'s received update and its truth."""
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
    x, y = true_inputs(exp, task, res.steps)
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
) -> Iterator[ClientResult]:
    """``stream`` unchanged, each result written as it passes (the round's weights first)."""
    write_global(run, round, weights.detach().cpu())
    by_client = {t.client: t for t in tasks}
    for res in stream:
        record_one(run, exp, by_client[res.client], res)
        yield res
