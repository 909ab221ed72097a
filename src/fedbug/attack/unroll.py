"""The client's local steps as the server knows them, for Inverting Gradients' unrolled attack
(:class:`~fedbug.attack.inversion.Unroll`).

The server holds the run's config: the optimiser (SGD's learning rate, momentum, weight decay,
``clip_grad_norm``), the batch size, and the freeze policy and algorithm whose units train at
each local step (FedBug's gradual unfreezing, FedSeq's round schedule, FedBABU's frozen head).
:func:`unroll_of` asks the run's own policy and algorithm, built on the attacked model as a run
builds them (:func:`~fedbug.engine.build.build_parts`), which units train at each step, as the
client's loop asks them (:func:`~fedbug.engine.client.step_units`), and keeps the parameters
the server saw move. What the server cannot know is left as the attack's model and said:

* the client's shuffle: step ``k`` trains on the dummy inputs' batch ``k mod per_epoch``, so
  epochs after the first are replayed in the first's order;
* a policy that chooses its units during training (FreezeFL's probe epoch: its session
  overrides ``end_of_epoch``): the fresh session's answer, every sent unit at every step;
* units the client trained and did not send: held at the received weights.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from fedbug.attack.inversion import Observation, Unroll
from fedbug.attack.records import RecordedUpdate
from fedbug.attack.replay import Finding


def per_epoch(num_samples: int, batch_size: int) -> int:
    """Local steps an epoch (the last batch smaller), as the client counts them."""
    return max(1, -(-num_samples // batch_size))


def step_schedule(cfg: Any, model: nn.Module, meta: dict[str, Any]) -> tuple[list[set[str]], bool]:
    """Per local step (0-based), the names of the parameters it trains, from the run's own
    policy (with its round schedule) and algorithm, as the client's loop asks them; and
    whether the policy chooses a client's units from its training (:func:`decides`)."""
    from fedbug.algorithms.base import ClientSession, build_algorithm
    from fedbug.core.protocol import ClientTask
    from fedbug.engine.build import build_parts
    from fedbug.engine.client import step_units
    from fedbug.policies.base import StepCtx

    blocks = {name: cfg.options(name) for name in type(cfg).model_fields}
    alg = build_algorithm(cfg.algorithm, cfg.global_lr, blocks)
    example = torch.zeros(2, *meta["input_shape"])
    parts = build_parts(cfg, alg, copy.deepcopy(model), example)
    n, steps = int(meta["num_samples"]), int(meta["steps"])
    r, client = int(meta["round"]), int(meta.get("first_client", meta["client"]))
    lr = float(meta.get("client_lr", meta["lr"]))  # a release's is times global_lr
    task = ClientTask(r, client, cfg.seed, lr, n, rounds=cfg.rounds)
    policy = parts.policy.start_client(task)
    session = ClientSession(alg, task, torch.zeros(n, dtype=torch.long))
    space, pe = parts.space, per_epoch(n, cfg.batch_size)
    names = [(nm, u) for nm, is_p, u in zip(space.names, space.is_param, space.unit_of) if is_p]
    out = []
    for k in range(1, steps + 1):
        ctx = StepCtx(k, steps, parts.policy_units, r, client, cfg.rounds)
        units = set(step_units(policy, session, ctx, pe, parts.layout.extra))
        out.append({nm for nm, u in names if u in units})
    return out, decides(policy)


def decides(session: Any) -> bool:
    """Whether a policy's client session picks units from the client's training (it answers
    at the end of an epoch: FreezeFL's probe), which the config does not tell; an intersection
    (a policy under FedSeq's round schedule) decides where one of its parts does."""
    from fedbug.policies.base import PolicySession

    parts = getattr(session, "sessions", None)
    if parts is not None:
        return any(decides(p) for p in parts)
    return type(session).end_of_epoch is not PolicySession.end_of_epoch


def unroll_of(
    cfg: Any, up: RecordedUpdate, obs: Observation, client_lr: float
) -> tuple[Unroll, list[Finding]]:
    """The :class:`Unroll` of ``up``'s local steps over the parameters ``obs`` matches, and
    what in it is the attack's guess (warnings)."""
    meta = up.meta
    schedule, chosen_in_training = step_schedule(cfg, obs.model, meta)
    trained = [tuple(k for k in obs.target if k in step) for step in schedule]
    n, bs = int(meta["num_samples"]), cfg.batch_size
    pe = per_epoch(n, bs)
    unroll = Unroll(
        trained,
        lr=client_lr,
        batch_size=bs,
        per_epoch=pe,
        momentum=float(meta.get("momentum", cfg.momentum)),
        weight_decay=float(meta.get("weight_decay", cfg.weight_decay)),
        clip=cfg.clip_grad_norm,
    )
    found = []
    if len(schedule) > pe:
        found.append(
            Finding(
                "warn",
                "local_epochs",
                f"{len(schedule)} steps over {pe} batches an epoch: the client's shuffle is "
                "unknown, so later epochs are replayed in the first's order (the score is a "
                "lower bound)",
            )
        )
    if chosen_in_training:
        found.append(
            Finding(
                "warn",
                "policy",
                f"{cfg.policy} chooses a client's units during its training, which the config "
                "does not tell: the replay trains every sent unit at every step",
            )
        )
    return unroll, found
