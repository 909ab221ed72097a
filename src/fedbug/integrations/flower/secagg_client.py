"""The node's side of ``flower.secagg``: Flower's ``secaggplus_mod`` on the messages of the SecAgg+
protocol, and the reply the mod masks.

Under secure aggregation the ClientApp's TRAIN handler still runs
:func:`fedbug.engine.client.train_client`, then answers with a legacy ``FitRes`` record (what
``secaggplus_mod`` reads): its parameters one fixed-length vector
(:func:`~fedbug.integrations.flower.secagg_vector.client_vector`), ``num_examples`` 1 (the weight
is inside the vector, so the mod's own weighting is the identity and the server never learns a
client's sample count from it), and its metrics one JSON string of what the server may see in the
clear (:data:`CLEAR`). The mod quantises the vector, masks it and clears every array of the reply,
so the update itself never leaves the node unmasked.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from flwr.app import Context, Message, RecordDict
from flwr.app.message_type import MessageType
from flwr.client.mod import secaggplus_mod
from flwr.clientapp.typing import ClientAppCallable
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat

from fedbug.core.finite import non_finite_count
from fedbug.core.protocol import ClientResult, ClientTask
from fedbug.integrations.flower.messages import SCALARS
from fedbug.integrations.flower.secagg_vector import (
    Layout,
    client_vector,
    extras_layout,
    on_grid,
)

#: The key of the clear JSON among the FitRes metrics.
META = "fedbug"
#: The result's fields the server sees in the clear: what the run's schedule and the simulated
#: system fix (costs, sample count, the units trained and sent), not what the data made.
CLEAR = tuple(k for k in SCALARS if k != "train_loss")


def secagg_mod(msg: Message, ctxt: Context, call_next: ClientAppCallable) -> Message:
    """Flower's ``secaggplus_mod`` for a TRAIN message of the SecAgg+ protocol (it carries the
    protocol's config record); every other message goes straight to the handler."""
    if is_secure(msg):
        return secaggplus_mod(msg, ctxt, call_next)
    return call_next(msg, ctxt)


def is_secure(msg: Message) -> bool:
    """Whether ``msg`` is a TRAIN message of the SecAgg+ protocol."""
    return (
        msg.metadata.message_type == MessageType.TRAIN
        and RECORD_KEY_CONFIGS in msg.content.config_records
    )


def non_finite(result: ClientResult) -> str | None:
    """Why the update cannot enter the sum (a non-finite loss, delta or extra), or None."""
    loss = result.train_loss
    if loss is not None and not math.isfinite(float(loss)):
        return f"non-finite train loss ({loss})"
    tensors = {"weights": result.delta, **{f"extra {k}": v for k, v in result.extras.items()}}
    for what, t in tensors.items():
        bad = non_finite_count(t)
        if bad:
            return f"non-finite {what} ({bad} of {t.numel()} update entries are nan or inf)"
    return None


def secure_reply(result: ClientResult, exp: Any, task: ClientTask, sent: list[bool]) -> RecordDict:
    """The legacy FitRes record ``secaggplus_mod`` masks: the client's vector, weight 1, and the
    clear fields. A non-finite update sends zeros (it adds nothing) and says why in the clear,
    so the server drops it or stops, as ``on_divergence`` says. Raises ``ValueError`` for an
    update that holds a subset of its units' entries (a sub-model): SecAgg+ sums whole units."""
    if result.entries is not None:
        raise ValueError(
            f"algorithm {exp.cfg.algorithm} sends a sub-model (a subset of each unit's entries), "
            "and flower.secagg sums whole units; remove flower.secagg for it"
        )
    sa, cfg, space = exp.cfg.flower.secagg, exp.cfg, exp.space
    extras = extras_layout(result.extras)
    weighted = cfg.weighting == "samples"
    layout = Layout(
        space, weighted, sa.max_weight, extras, sa.clipping_range, sa.quantization_range
    )
    shared = exp.algorithm.shared_mask(space.num_units)
    counted = shared if cfg.aggregation == "full" else [False] * space.num_units
    reason = non_finite(result)
    if reason is None:
        vec = client_vector(result, layout, sent, counted)
        if sa.residual:
            vec = on_grid(vec, sa.clipping_range, sa.quantization_range)
    else:
        vec = np.zeros(layout.size() * (2 if sa.residual else 1))
    clear = {
        "client": result.client,
        "num-samples": result.num_samples,
        "fields": {k: getattr(result, k) for k in CLEAR},
        "trained": [bool(t) for t in result.trained],
        "uploaded": [bool(t) for t in result.uploaded],
        "extras": [[k, list(shape)] for k, shape in layout.extras],
        "non-finite": reason or "",
    }
    # the mod's stochastic rounding draws from numpy's global generator: seeded by the task,
    # so a run's secure sums are the same each time it is run (the masks cancel exactly)
    np.random.seed(
        np.random.SeedSequence([task.seed, task.round, task.client, 5]).generate_state(1)
    )
    fitres = FitRes(
        Status(Code.OK, ""), ndarrays_to_parameters([vec]), 1, {META: json.dumps(clear)}
    )
    return compat.fitres_to_recorddict(fitres, keep_input=False)
