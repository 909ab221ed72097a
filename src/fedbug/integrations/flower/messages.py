"""fedbug's client task and client result as Flower messages, and back.

A TRAIN message's content holds ``weights`` (the global weights by parameter name, an
:class:`ArrayRecord`), ``payload`` (the algorithm's server payload, e.g. FedDyn's nothing,
SCAFFOLD's control variate) and ``task`` (a :class:`ConfigRecord`: round, client, seed, learning
rate, ...). The reply holds ``update`` (the deltas of the units the client sends: the units it
trained under ``upload: partial``, all shared units under ``upload: full``), ``extras`` (the
result's extra tensors by key, and the entries it holds where not all), ``metrics`` (numbers as
a :class:`MetricRecord`) and ``result`` (flags, and the typed fields as JSON).
:class:`ArrayRecord` keeps float32 bits, so the server sees exactly what the client computed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import Tensor

from fedbug.core.units import ParamSpace
from fedbug.engine.client import ClientResult, ClientTask

TRAIN = "train"
QUERY = "query"


class ReplyError(ValueError):
    """A reply that cannot be turned into a client result (the reason is the message)."""


def record_int(record: ConfigRecord, key: str) -> int:
    """``int(record[key])``, a number this package wrote (a :class:`ConfigRecord` types each
    value as any of its kinds, lists included: a list is a ``TypeError``, as ``int`` gives)."""
    value = record[key]
    if isinstance(value, list):
        raise TypeError(f"{key} is a list, not a number")
    return int(value)


def record_float(record: ConfigRecord, key: str) -> float:
    """``float(record[key])``, as :func:`record_int`."""
    value = record[key]
    if isinstance(value, list):
        raise TypeError(f"{key} is a list, not a number")
    return float(value)


def _arrays(tensors: dict[str, Tensor]) -> ArrayRecord:
    return ArrayRecord({k: v.detach().contiguous() for k, v in tensors.items()})


def encode_weights(weights: Tensor, space: ParamSpace) -> ArrayRecord:
    """The global weights as a record, made once a round and shared by its TRAIN messages (Flower
    sends an object that several messages hold once, and the server keeps one copy)."""
    return _arrays(space.state_dict(weights))


def encode_task(
    weights: ArrayRecord, task: ClientTask, *, has_state: bool, threads: int
) -> RecordDict:
    """The content of one client's TRAIN message; ``weights`` from :func:`encode_weights`."""
    return RecordDict(
        {
            "weights": weights,
            "payload": _arrays(task.payload),
            "task": ConfigRecord(
                {
                    "round": task.round,
                    "client": task.client,
                    "seed": task.seed,
                    "lr": float(task.lr),
                    "mean-samples": float(task.mean_samples),
                    "rounds": task.rounds,
                    "extra": json.dumps(task.extra),
                    "has-state": has_state,
                    "threads": threads,
                }
            ),
        }
    )


def decode_task(content: RecordDict, space: ParamSpace) -> tuple[Tensor, ClientTask, dict]:
    """(flat weights, task, task config) from a TRAIN message's content."""
    cfg = content.config_records["task"]
    state = content.array_records["weights"].to_torch_state_dict()
    weights = flat_from(state, space, set(range(space.num_units)))
    payload = content.array_records["payload"].to_torch_state_dict()
    task = ClientTask(
        round=record_int(cfg, "round"),
        client=record_int(cfg, "client"),
        seed=record_int(cfg, "seed"),
        lr=record_float(cfg, "lr"),
        mean_samples=record_float(cfg, "mean-samples"),
        payload=payload,
        rounds=record_int(cfg, "rounds"),
        extra=json.loads(str(cfg["extra"])),
    )
    return weights, task, dict(cfg)


def sent_units(result: ClientResult) -> list[bool]:
    """The units whose deltas a reply carries (the client's ``uploaded``, as the aggregation
    takes them)."""
    return list(result.uploaded)


def _scalar_fields() -> tuple[str, ...]:
    """:class:`ClientResult`'s fields that are numbers or flags (optional or not), in their
    order; a field added there travels without a second list to keep. The client and its
    sample count travel apart (``client``, ``num-samples``)."""
    hints = typing.get_type_hints(ClientResult)
    scalar = {int, float, bool, int | None, float | None, bool | None}
    apart = {"client", "num_samples"}
    return tuple(
        f.name
        for f in dataclasses.fields(ClientResult)
        if f.name not in apart and hints[f.name] in scalar
    )


#: The result's scalar fields a reply carries as JSON (the rest: arrays and flags).
SCALARS = _scalar_fields()


def encode_reply(result: ClientResult, space: ParamSpace, sent: list[bool]) -> RecordDict:
    """The content of the reply to a TRAIN message: the sent units' deltas, the result's typed
    fields, the entries it holds (if not all) and its extra tensors (``extras``, any keys)."""
    full = space.state_dict(result.delta)
    update = {n: full[n] for n, u in zip(space.names, space.unit_of) if sent[u]}
    fields = {k: v for k, v in vars(result).items() if k in SCALARS}
    numbers = {
        k: float(v)
        for k, v in fields.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))
    }
    arrays = dict(result.extras)
    extra_keys = sorted(arrays)
    if result.entries is not None:
        arrays = {**arrays, ENTRIES: result.entries}
    return RecordDict(
        {
            "update": _arrays(update),
            "extras": _arrays(arrays),
            "metrics": MetricRecord({"num-examples": result.num_samples, **numbers}),
            "result": ConfigRecord(
                {
                    "client": result.client,
                    "num-samples": result.num_samples,
                    "trained": [bool(t) for t in result.trained],
                    "sent": [bool(t) for t in sent],
                    "uploaded": [bool(t) for t in result.uploaded],
                    "fields": json.dumps(fields),
                    "info": json.dumps(result.info),
                    "figures": json.dumps(result.figures),
                    "extras": json.dumps(extra_keys),
                }
            ),
        }
    )


#: The key of the held-entries mask among a reply's arrays (not a valid extras key).
ENTRIES = "__entries__"


def flat_from(tensors: dict[str, Tensor], space: ParamSpace, units: set[int]) -> Tensor:
    """A flat vector with the given units' entries from ``tensors`` and zeros elsewhere.

    Raises :class:`ReplyError` on a missing or unknown name, a wrong shape or dtype.
    """
    expected = {n for n, u in zip(space.names, space.unit_of) if u in units}
    unknown = sorted(set(tensors) - expected)
    if unknown:
        raise ReplyError(f"unexpected arrays {unknown[:3]} (not in the units it says it sent)")
    missing = sorted(expected - set(tensors))
    if missing:
        raise ReplyError(f"missing arrays {missing[:3]}")
    flat = torch.zeros(space.total, dtype=torch.float32)
    for name, off, n, shape in zip(space.names, space.offsets, space.numels, space.shapes):
        if name not in tensors:
            continue
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise ReplyError(f"array {name!r} has shape {tuple(t.shape)}, expected {shape}")
        if t.dtype != torch.float32:
            raise ReplyError(f"array {name!r} has dtype {t.dtype}, expected float32")
        flat[off : off + n] = t.reshape(-1)
    return flat


def _flags(value: Any, space: ParamSpace, what: str) -> list[bool]:
    if not isinstance(value, list) or len(value) != space.num_units:
        raise ReplyError(f"{what} must hold one flag per unit ({space.num_units})")
    return [bool(v) for v in value]


def decode_reply(content: RecordDict, space: ParamSpace, client: int) -> ClientResult:
    """The client result a reply carries; :class:`ReplyError` says why one cannot be read."""
    try:
        info = content.config_records["result"]
        update = content.array_records["update"].to_torch_state_dict()
    except (KeyError, TypeError, ValueError) as e:
        raise ReplyError(f"reply lacks its records ({e})") from None
    sender = info.get("client")  # an int as written; anything else is malformed, not a crash
    if not isinstance(sender, int) or isinstance(sender, bool) or sender != client:
        raise ReplyError(f"reply is for client {sender!r}, sent to client {client}")
    sent = _flags(info.get("sent"), space, "sent")
    trained = _flags(info.get("trained"), space, "trained")
    uploaded = _flags(info.get("uploaded"), space, "uploaded")
    if uploaded != sent:  # the server aggregates the units a result says it uploaded
        raise ReplyError("reply's uploaded flags differ from the units it sent")
    delta = flat_from(update, space, {u for u, s in enumerate(sent) if s})
    try:
        fields = json.loads(str(info.get("fields", "{}")))
        extra_info = json.loads(str(info.get("info", "{}")))
        figures = json.loads(str(info.get("figures", "{}")))
        extra_keys = json.loads(str(info.get("extras", "[]")))
        arrays = content.array_records["extras"].to_torch_state_dict()
    except json.JSONDecodeError:
        raise ReplyError("reply fields are not JSON") from None
    except (KeyError, TypeError, ValueError) as e:
        raise ReplyError(f"reply lacks its extras ({e})") from None
    if not isinstance(fields, dict) or set(fields) - set(SCALARS):
        raise ReplyError(f"reply fields must be a mapping of {', '.join(SCALARS)}")
    if not isinstance(figures, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
        for k, v in figures.items()
    ):
        raise ReplyError("reply figures must be a mapping of names to numbers")
    if not isinstance(extra_keys, list) or set(arrays) - {ENTRIES} != set(extra_keys):
        raise ReplyError("reply extras do not match the keys it lists")
    n = info.get("num-samples")
    return ClientResult(
        client=client,
        num_samples=n if isinstance(n, int) else -1,
        delta=delta,
        trained=trained,
        state={},
        uploaded=uploaded,
        entries=arrays.get(ENTRIES),
        extras={k: arrays[k] for k in extra_keys},
        info=extra_info if isinstance(extra_info, dict) else {},
        figures=figures,
        **fields,
    )
