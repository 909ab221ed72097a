"""The client's local steps as the server knows them, for Inverting Gradients' unrolled attack
(:class:`~fedbug.attack.inversion.Unroll`).

The server holds the run's config: the optimiser (SGD's learning rate, momentum, weight decay,
``clip_grad_norm``), the batch size, and the freeze policy and algorithm whose units train at
each local step (FedBug's gradual unfreezing, FedSeq's round schedule, FedBABU's frozen head).
:func:`unroll_of` asks the run's own policy and algorithm, built on the run's model as a run
builds them (:func:`attacked_parts`, the builder the attacked model comes from too), which units
train at each step, as the
client's loop asks them (:func:`~fedbug.engine.client.step_units`), and keeps the parameters
the server saw move. What the server cannot know is left as the attack's model and said:

* the client's shuffle: step ``k`` trains on the dummy inputs' batch ``k mod per_epoch``, so
  epochs after the first are replayed in the first's order (``known_order``: the shuffle fedbug
  draws from the run's seed, given to the attack: an upper bound, a server that knows it);
* a policy that chooses its units during training (FreezeFL's probe epoch: its session
  overrides ``end_of_epoch``), or from the server's per-client config (CoCoFL's block,
  FreezeFL's deadline: it overrides ``client_config``): every sent unit at every step;
* an algorithm's client session that cannot open without the client's runtime: the plain
  session's answers (every unit the policy allows);
* units the client trained and did not send (a personal head) train in the replay from the
  received weights, which are the client's own only where it has never kept them apart.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from fedbug.attack.inversion import Observation, Unroll
from fedbug.attack.replay import Finding
from fedbug.core.protocol import ClientTask, TrainSettings
from fedbug.engine.build import Parts
from fedbug.errors import ConfigError
from fedbug.results.updates import RecordedUpdate


def _warn(key: str, line: str) -> Finding:
    return Finding("warn", key, line)


def trainer(meta: dict[str, Any]) -> tuple[int, int, float]:
    """(round, client, learning rate) of the client whose steps an update is: a release of one
    client's update names it and its rate apart (``first_client``, ``client_lr``: the
    release's ``lr`` is times ``global_lr``)."""
    client = int(meta.get("first_client", meta["client"]))
    return int(meta.get("round", 1)), client, float(meta.get("client_lr", meta["lr"]))


@dataclass
class Schedule:
    """Per local step (0-based) the parameters it trains, its steps an epoch, and what in it
    is a guess (warnings)."""

    trained: list[tuple[str, ...]]
    per_epoch: int
    found: list[Finding] = field(default_factory=list)


def run_algorithm(cfg: Any) -> Any:
    """The run's algorithm, built from its config as a run builds it."""
    from fedbug.algorithms.base import build_algorithm

    blocks = {name: cfg.options(name) for name in type(cfg).model_fields}
    return build_algorithm(cfg.algorithm, cfg.global_lr, blocks)


def attacked_parts(cfg: Any, meta: dict[str, Any]) -> tuple[Any, Parts]:
    """The run's algorithm and what it trained, built as the run built them: the config's
    model (its builder's options, :func:`~fedbug.models.model_kwargs`) on the recorded input
    shape and classes, wrapped for the algorithm, cut into units and laid out, with the
    policy (:func:`~fedbug.engine.build.build_parts`). Its weights are the builder's (seed 0),
    for the received ones to replace. A recorded update naming another model is refused."""
    from fedbug.engine.build import build_parts
    from fedbug.models import build_model, model_kwargs

    if meta["model"] != cfg.model:
        raise ConfigError(
            f"recorded update of client {meta['client']} names model {str(meta['model'])!r} "
            f"and config.yaml {cfg.model!r}; record the round again"
        )
    shape = tuple(meta["input_shape"])
    model = build_model(cfg.model, shape, meta["num_classes"], 0, **model_kwargs(cfg))
    alg = run_algorithm(cfg)
    return alg, build_parts(cfg, alg, model, torch.zeros(2, *shape))


def settings_of(cfg: Any, meta: dict[str, Any] | None = None) -> TrainSettings:
    """The client's local-training settings: the run's (:func:`~fedbug.engine.experiment.
    train_settings`), with the momentum and weight decay a recorded update ``meta`` holds."""
    from fedbug.engine.experiment import train_settings

    run = train_settings(cfg)
    if meta is None:
        return run
    momentum = float(meta.get("momentum", run.momentum))
    decay = float(meta.get("weight_decay", run.weight_decay))
    return dataclasses.replace(run, momentum=momentum, weight_decay=decay)


def recorded_task(cfg: Any, meta: dict[str, Any]) -> ClientTask:
    """The recorded client's round config, from the engine's builder
    (:func:`~fedbug.engine.client_task.client_task`) with what the record holds: its round,
    client and rate; its own sample count for the run's mean (which is not recorded); no
    payload nor per-client config (the server's, not recorded)."""
    from fedbug.engine.client_task import client_task

    r, client, lr = trainer(meta)
    return client_task(cfg, r, client, int(meta["num_samples"]), lr=lr)


def open_session(cfg: Any, alg: Any, task: Any, n: int) -> tuple[Any, list[Finding]]:
    """The algorithm's client session of ``task`` for a client of ``n`` samples (their labels
    unknown: zeros), or, where it cannot open without the client's runtime, the plain session,
    with a warning saying so."""
    from fedbug.algorithms.base import ClientSession

    labels = torch.zeros(n, dtype=torch.long)
    try:
        return alg.start_client(task, labels), []
    except (AttributeError, TypeError, ValueError, KeyError):  # needs the client's runtime
        why = "needs the client's runtime: the replay asks the plain session which units train"
        session = ClientSession(alg, task, labels)
        return session, [_warn("algorithm", f"{cfg.algorithm}'s client session {why}")]


def step_schedule(cfg: Any, meta: dict[str, Any]) -> Schedule:
    """The client's steps from the run's own policy (with its round schedule) and algorithm,
    as the client's loop asks them (its algorithm session counting the steps: FedRep's head
    epochs come first)."""
    from fedbug.engine.client import step_units
    from fedbug.policies.base import PolicySession, StepCtx

    alg, parts = attacked_parts(cfg, meta)
    n, steps = int(meta["num_samples"]), int(meta["steps"])
    task = recorded_task(cfg, meta)
    r, client = task.round, task.client
    session, found = open_session(cfg, alg, task, n)
    k_all, pe = session.local_step_count(n, settings_of(cfg, meta))
    if k_all != steps:
        why = f"the config gives {k_all} local steps and the client took {steps}"
        found.append(_warn("local_steps", f"{why}: the replay takes the client's"))
    space = parts.space
    names = [(nm, u) for nm, is_p, u in zip(space.names, space.is_param, space.unit_of) if is_p]
    if configured(parts.policy):
        sent = set(meta["units_sent"])
        why = "picks a client's units from the server's per-client config, which the attack"
        found.append(_warn("policy", f"{cfg.policy} {why} does not rebuild: every sent unit "
                           "trains at every step of the replay"))  # fmt: skip
        return Schedule([tuple(nm for nm, u in names if u in sent)] * steps, pe, found)
    policy: PolicySession = parts.policy.start_client(task)
    if decides(policy):
        why = "chooses a client's units during its training, which the config does not tell"
        found.append(_warn("policy", f"{cfg.policy} {why}: the replay trains what its fresh "
                           "session allows"))  # fmt: skip
    trained = []
    for k in range(1, steps + 1):
        ctx = StepCtx(k, steps, parts.policy_units, r, client, cfg.rounds)
        units = set(step_units(policy, session, ctx, pe, parts.layout.extra))
        trained.append(tuple(nm for nm, u in names if u in units))
    return Schedule(trained, pe, found)


def configured(policy: Any) -> bool:
    """Whether a policy's client answers come from the server's per-client config (it
    overrides ``client_config``: CoCoFL's block, FreezeFL's deadline); an intersection is
    where one of its parts is."""
    from fedbug.policies.base import FreezePolicy

    parts = getattr(policy, "policies", None)
    if parts is not None:
        return any(configured(p) for p in parts)
    return type(policy).client_config is not FreezePolicy.client_config


def decides(session: Any) -> bool:
    """Whether a policy's client session picks units from the client's training (it answers
    at the end of an epoch: FreezeFL's probe), which the config does not tell; an intersection
    (a policy under FedSeq's round schedule) decides where one of its parts does."""
    from fedbug.policies.base import PolicySession

    parts = getattr(session, "sessions", None)
    if parts is not None:
        return any(decides(p) for p in parts)
    return type(session).end_of_epoch is not PolicySession.end_of_epoch


def known_batches(cfg: Any, meta: dict[str, Any], steps: int, per_epoch: int) -> list[Tensor]:
    """Each step's rows of the dummy inputs (which stand, in order, for the samples the client
    drew first: :func:`~fedbug.engine.client.first_drawn`, as ``record_updates`` keeps them) as
    the client drew them: its shuffle (:class:`~fedbug.engine.client.ShuffledBatches`) from its
    own generator, drawn again from the run's seed. DP-SGD's Poisson batches are refused: drawn
    between its noise, they are not drawn again without the client's training."""
    from fedbug.engine.client import ShuffledBatches, first_drawn, shuffle_generator

    if cfg.dp_sgd is not None and cfg.dp_sgd.sampling == "poisson":
        raise ConfigError(
            "--known-order replays the client's shuffle, and under dp_sgd.sampling: poisson its "
            "batches were drawn between DP-SGD's noise; drop --known-order, or record a run "
            "with dp_sgd.sampling: shuffle"
        )
    n = int(meta["num_samples"])
    r, client, _ = trainer(meta)
    draws = ShuffledBatches(n, cfg.batch_size, per_epoch, shuffle_generator(cfg.seed, r, client))
    drawn = [draws.indices(k) for k in range(1, steps + 1)]
    row = torch.empty(n, dtype=torch.long)
    first = first_drawn(drawn)
    row[first] = torch.arange(len(first))  # sample -> its row among the dummy inputs
    return [row[idx] for idx in drawn]


def unroll_of(
    cfg: Any, up: RecordedUpdate, obs: Observation, known_order: bool = False
) -> tuple[Unroll, list[Finding]]:
    """The :class:`Unroll` of ``up``'s local steps (every parameter a step trains, sent or
    not; the match is over ``obs.target``'s), and what in it is the attack's guess;
    ``known_order``: the client's batches as it drew them (:func:`known_batches`)."""
    meta = up.meta
    sched = step_schedule(cfg, meta)
    s = settings_of(cfg, meta)
    unroll = Unroll(
        sched.trained,
        lr=trainer(meta)[2],
        batch_size=s.batch_size,
        per_epoch=sched.per_epoch,
        momentum=s.momentum,
        weight_decay=s.weight_decay,
        clip=s.clip_grad_norm,
    )
    found = list(sched.found)
    if known_order:
        unroll.batches = known_batches(cfg, meta, len(sched.trained), sched.per_epoch)
        found.append(_warn("--known-order", "the attack is given the client's shuffle (fedbug "
                           "draws it from the run's seed), which a server does not know: an "
                           "upper bound of the leak"))  # fmt: skip
    elif len(sched.trained) > sched.per_epoch:
        why = f"{len(sched.trained)} steps over {sched.per_epoch} batches an epoch"
        found.append(_warn("local_epochs", f"{why}: the client's shuffle is unknown, so later "
                           "epochs are replayed in the first's order (the score is a lower "
                           "bound)"))  # fmt: skip
    return unroll, found
