"""The round's test figures: global, mean of local models, each client on its own test set."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import Tensor

from fedbug.engine.pfl import (
    ClientScore,
    FinetuneSettings,
    PersonalizedEvaluator,
    clients_csv,
    pfl_summary,
    plot_clients,
)
from fedbug.engine.pfl import summarise as summarise_scores
from fedbug.results import RunDir, atomic_write_text

if TYPE_CHECKING:
    from fedbug.engine.experiment import Experiment
    from fedbug.engine.states import ClientStates, LocalModelMean


def evaluate_round(
    exp: Experiment, eval_weights: Tensor, local_mean: LocalModelMean | None, states: ClientStates
) -> dict[str, Any]:
    """The round's test figures for the config's ``evaluation`` (plus each client's own test
    accuracy under the global model where clients have test sets: FreezeFL's acc_client_mean)."""
    if exp.cfg.evaluation == "personalized":
        figures = client_figures(exp, eval_weights, states.get)
        return {"test_acc": figures["acc_client_mean"], "test_loss": None, **figures}
    out: dict[str, Any]
    if local_mean is not None:
        out = test_figures(exp.evaluator.figures(local_mean.mean()))
        out.update(test_figures(exp.evaluator.figures(eval_weights), "_server"))
    else:
        out = test_figures(exp.evaluator.figures(eval_weights))
    if exp.personal is not None:
        out.update(client_figures(exp, eval_weights, lambda _client: {}, generic=True))
    return out


def test_figures(figures: dict[str, float], suffix: str = "") -> dict[str, float]:
    """A task's figures as record fields: ``test_<name><suffix>``, the loss first."""
    out = {f"test_loss{suffix}": figures["loss"]}
    out.update({f"test_{k}{suffix}": v for k, v in figures.items() if k != "loss"})
    return out


def unevaluated(exp: Experiment) -> dict[str, Any]:
    """The test fields of a round without evaluation (None each)."""
    return {f"test_{exp.task.headline}": None, "test_loss": None}


def client_figures(
    exp: Experiment,
    weights: Tensor,
    states: Callable[[int], dict[str, Tensor]],
    generic: bool = False,
) -> dict[str, Any]:
    """Mean, std (over clients) and weighted accuracy of every client on its own test set
    (``generic``: the global model's own output, without any personal part)."""
    figures = summarise_scores(_personal(exp).evaluate(weights, states, generic=generic))
    return {
        "acc_client_mean": figures["mean"],
        "acc_client_std": figures["std"],
        "acc_client_weighted": figures["weighted"],
    }


def _personal(exp: Experiment) -> PersonalizedEvaluator:
    """The run's evaluator of each client on its own test set (there is one under
    ``evaluation: personalized`` and where the clients have test sets)."""
    assert exp.personal is not None, "the clients have no test sets to evaluate on"
    return exp.personal


def personalize(
    exp: Experiment,
    weights: Tensor,
    states: ClientStates,
    rd: RunDir | None,
    on_phase: Callable[[str, int, int], None] | None = None,
) -> dict[str, Any]:
    """After the last round: every client's accuracy before and after fine-tuning on its own
    data (FedSeq Algorithm 1, lines 20-26); writes clients.csv and clients.png.
    ``on_phase(what, done, total)`` hears how far each step is (client by client)."""
    cfg, personal = exp.cfg, _personal(exp)
    phase = on_phase or (lambda what, done, total: None)
    n = len(personal.train_parts)
    phase(EVALUATING, 0, n)
    before: list[ClientScore] = []
    for i in range(n):  # as evaluate does over all clients, one at a time to tell the progress
        before += personal.evaluate(weights, states.get, [i])
        phase(EVALUATING, i + 1, n)
    settings = FinetuneSettings(
        epochs=cfg.finetune_epochs,
        lr=cfg.finetune_lr if cfg.finetune_lr is not None else cfg.lr,
        momentum=cfg.finetune_momentum,
        weight_decay=cfg.weight_decay,
        batch_size=cfg.batch_size,
        optimizer=cfg.optimizer,
        clip_grad_norm=cfg.clip_grad_norm,
    )
    phase(FINETUNING, 0, n)
    after = personal.finetune(
        weights, states.get, settings, cfg.seed, on_client=lambda done: phase(FINETUNING, done, n)
    )
    block = pfl_summary(before, after)
    if rd is not None:
        phase(WRITING_CLIENTS, 0, 1)
        atomic_write_text(rd.path / "clients.csv", clients_csv(block))
        plot_clients(block, rd.path / "clients.png", f"{cfg.name}: each client's own accuracy")
        phase(WRITING_CLIENTS, 1, 1)
    return block


#: the steps of :func:`personalize`, as ``on_phase`` names them
EVALUATING = "evaluating each client"
FINETUNING = "fine-tuning each client"
WRITING_CLIENTS = "writing clients.csv and clients.png"


def round_bytes(exp: Experiment, shared: set[int], round: int, model_bytes: int) -> int:
    """Bytes a client downloads: the shared units the policy says clients need this round
    (:meth:`~fedbug.policies.FreezePolicy.download_units`)."""
    sent = exp.policy.download_units(round, frozenset(shared))
    if sent == shared:
        return model_bytes
    return exp.space.bytes_of([u in sent for u in range(exp.space.num_units)])


def trained_sublayers(exp: Experiment, round: int) -> list[int]:
    """The base sub-layers (1-based, input to output) the policy lets train in ``round``."""
    return exp.policy.trained_sublayers(round, len(exp.layout.sublayers))
