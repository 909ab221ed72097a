"""fedbug's side of a PFLlib comparison: its public pieces driven on a scenario's inputs.

:func:`run_rounds` builds the run as the engine does (``fedbug.engine.experiment.Experiment``:
the model wrapped by the algorithm, its units, the base/head layout, the client runtime) and
runs a hand-built round loop over :func:`fedbug.engine.client.train_client`,
:class:`~fedbug.engine.aggregate.Aggregate` and the algorithm's ``server_update``, every client
every
round or the clients the engine's selection draws, keeping each client's state (its personal
units, ``local.<unit>``). After each round it returns the global weights and each client's local
model (a participant: the received weights plus its update, personal units included; any other
client: what it holds, the previous global weights with its personal units). For FedBABU it then
fine-tunes every client with the runtime of the personalized evaluation
(``PersonalizedEvaluator.finetune_runtime``) from the final global model (the paper) or, with
``finetune_from: local``, from the client's own last local model (PFLlib). :func:`run_engine`
runs the same case through ``fedbug.run`` and returns its final weights and per-client
accuracies after fine-tuning, to check that the engine does what the loop does.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

import fedbug
from benchmarks.equivalence.pfl_scenario import PflScenario, build_model, client_data
from fedbug.core.units import ParamSpace
from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientTask, load_local_parts, train_client
from fedbug.engine.experiment import Experiment
from fedbug.engine.pfl import FINETUNE_ROUND, FinetuneSettings


@dataclass
class PflRun:
    space: ParamSpace
    names: list[str]  # the model's parameters in its own order (FedROD: personal head last)
    initial: Tensor
    shared: tuple[int, ...]  # units the server holds and averages
    local: tuple[int, ...]  # units each client keeps (its personal parameters)
    rounds: list[Tensor] = field(default_factory=list)  # global weights after each round
    clients: list[list[Tensor]] = field(default_factory=list)  # [round][client] local model
    steps: list[list[int]] = field(default_factory=list)  # [round][client] local steps
    participants: list[list[int]] = field(default_factory=list)  # [round] the selection's draw
    finetuned: list[Tensor] = field(default_factory=list)  # [client], FedBABU only
    finetune_acc: list[float | None] = field(default_factory=list)


def config_doc(s: PflScenario) -> dict[str, Any]:
    """The fedbug config of the scenario."""
    doc: dict[str, Any] = {
        "name": s.name,
        "model": "fedseq_cnn",
        "num_clients": s.clients,
        "clients_per_round": s.clients_per_round or s.clients,
        "partition": "natural",
        "augment": "none",
        "rounds": s.rounds,
        "local_epochs": s.local_epochs,
        "batch_size": s.batch_size,
        "lr": s.lr,
        "lr_decay": s.lr_decay,
        "weight_decay": 0.0,
        "momentum": 0.0,
        "weighting": "samples",
        "algorithm": s.method,
        "evaluation": "personalized",
        "finetune_epochs": s.finetune_epochs,
        "count_flops": False,
        "eval_every": s.rounds,
        "checkpoint_every": s.rounds,
        "memory_format": "contiguous",
        "seed": s.seed,
        "threads": torch.get_num_threads(),
    }
    if s.method == "fedrep":
        doc["fedrep"] = {"head_epochs": s.head_epochs}
    return doc


def dataset(s: PflScenario) -> fedbug.FederatedDataset:
    data = client_data(s)
    return fedbug.FederatedDataset.from_clients(
        "equivalence-pfl",
        [train for train, _ in data],
        test=[test for _, test in data],
        num_classes=s.num_classes,
    )


def _experiment(s: PflScenario, model: torch.nn.Module) -> Experiment:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Experiment(fedbug.config(**config_doc(s)), dataset=dataset(s), model=model)


def space_of(s: PflScenario) -> ParamSpace:
    return _experiment(s, build_model(s)).space


def run_rounds(s: PflScenario, perturb: float = 0.0) -> PflRun:
    """Global weights and every client's local model after each round (and FedBABU's
    fine-tuned models). ``perturb``: multiply each initial weight by 1 + perturb * N(0, 1)
    (seeded), to measure how far fedbug moves from itself when its start moves by
    rounding-sized amounts."""
    model = build_model(s)
    if perturb:
        g = torch.Generator().manual_seed(12345)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + perturb * torch.randn(p.shape, generator=g))
    exp = _experiment(s, model)
    cfg, alg, space = exp.cfg, exp.algorithm, exp.space
    rt = exp.make_runtime()
    weights = exp.initial_weights()
    local = alg.local_units(space.num_units)
    names = [n for n, _ in exp.template.named_parameters()]
    out = PflRun(space, names, weights.clone(), alg.shared_units(space.num_units), local)
    server = alg.init_server_state(weights, exp.num_clients)
    states = {i: alg.init_client_state(space) for i in range(exp.num_clients)}
    for r in range(1, cfg.rounds + 1):
        agg = Aggregate(space, cfg.weighting)
        payload = alg.payload(server)
        chosen = list(exp.selection.select(r, cfg.seed, exp.num_clients))
        trained = {}
        for i in chosen:  # in the selection's order, as the engine aggregates them
            lr = exp.lr_at(r)
            if s.lr_decay_by == "client":  # PFLlib's: once per round this client trained
                lr = cfg.lr * cfg.lr_decay ** sum(i in p for p in out.participants)
            task = ClientTask(r, i, cfg.seed, lr, exp.mean_samples, payload, cfg.rounds)
            res = trained[i] = train_client(weights, task, exp.client_data(i), states[i], rt)
            agg.add(res.delta, res.uploaded, res.num_samples, res.entries, res.extras)
        models = []
        for i in range(exp.num_clients):
            if i in trained:
                models.append(weights + trained[i].delta)
            else:  # it holds the weights it was last sent, with its own units in place
                models.append(weights.clone())
                load_local_parts(models[-1], states[i], space)
        for i, res in trained.items():
            if local:
                states[i] = res.state
        step = alg.server_update(weights, agg, server, r, exp.num_clients)
        weights, server = step.weights, step.state
        out.rounds.append(weights.clone())
        out.clients.append(models)
        out.steps.append([trained[i].steps if i in trained else 0 for i in range(exp.num_clients)])
        out.participants.append(chosen)
    if s.finetune_epochs:
        _finetune(s, exp, weights, states, out)
    return out


def _finetune(
    s: PflScenario, exp: Experiment, weights: Tensor, states: dict[int, Any], out: PflRun
) -> None:
    """What ``PersonalizedEvaluator.finetune`` does for every client (its runtime, its task),
    keeping each fine-tuned model; ``finetune_from: local`` starts a client from its own last
    local model instead of the final global one."""
    cfg = exp.cfg
    assert exp.personal is not None
    settings = FinetuneSettings(
        epochs=cfg.finetune_epochs,
        lr=cfg.finetune_lr if cfg.finetune_lr is not None else cfg.lr,
        momentum=cfg.finetune_momentum,
        weight_decay=cfg.weight_decay,
        batch_size=cfg.batch_size,
        optimizer=cfg.optimizer,
        clip_grad_norm=cfg.clip_grad_norm,
    )
    runtime = exp.personal.finetune_runtime(settings)
    for i in range(exp.num_clients):
        data = exp.client_data(i)
        task = ClientTask(FINETUNE_ROUND, i, cfg.seed, settings.lr, float(len(data)))
        start = weights if s.finetune_from == "global" else out.clients[-1][i]
        train_client(start, task, data, states[i], runtime)
        out.finetuned.append(runtime.flat.clone())
        # its accuracy on its own test set, as the evaluator scores it (no local parts to load)
        score = exp.personal.evaluate(out.finetuned[-1], lambda _: {}, clients=[i])[0]
        out.finetune_acc.append(score.acc)


def run_engine(s: PflScenario) -> tuple[Tensor, list[float | None]]:
    """The final server weights of the same case run by ``fedbug.run`` and each client's
    accuracy after fine-tuning (summary.json's ``pfl`` block)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = fedbug.config(**config_doc(s))
        result = fedbug.run(cfg, model=build_model(s), dataset=dataset(s))
    rows = result.summary["pfl"]["clients"]
    return result.weights, [r["acc_after_ft"] for r in rows]
