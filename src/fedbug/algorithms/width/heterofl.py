"""HeteroFL (Diao et al., ICLR 2021): each client trains the width-r_k sub-model of one model.

The sub-model of rate r keeps the first ``ceil(r * K)`` of the K channels (conv) or neurons
(linear) of every hidden layer, the same channels across a residual addition; the model input
and the output layer's rows are kept whole, so the sub-models are nested (paper Sec. 3.1,
Fig. 1; the authors' ``src/fed.py`` ``split_model``). The masks come from
:mod:`fedbug.algorithms.width.planner`; a width-r step is exactly the narrow network's step,
and the server averages each entry over the clients whose sub-model holds it (``combine``),
keeping an entry nobody holds (:mod:`fedbug.algorithms.width.base`). Evaluation is at rate 1, the
global model.

Options (the ``heterofl:`` block); the defaults are the authors' code, diaoenmao/HeteroFL at
``cc40f3e`` (control ``..._fix_a1-b1-c1-d1-e1_bn_1_1``):

- ``rates``: the rates, ``[1, 0.5, 0.25, 0.125, 0.0625]`` (the code's a-e) in equal shares, or
  a mapping rate -> share (``{1: 1, 0.5: 4}`` is the code's ``a1-b4``). Rates are relative to
  the global model (the code's ``model_rate / global_model_rate``), so 1 must be among them.
- ``assign``: ``fixed`` (the code's ``fix``, ``utils.py`` ``process_control``: client ids in
  blocks, ``N // sum(shares)`` clients per share, in the order the rates are listed, the
  clients left over taking the last rate), ``dynamic`` (the code's ``dynamic``: every round each
  client draws its rate with probabilities proportional to the shares, here from a generator
  addressed by (seed, round, client)), or ``by_ability`` (fedbug's: the ``fixed`` blocks over
  the clients sorted fastest first by the system model's abilities, largest rate first).
- ``rounding``: ``ceil`` (paper and code) or ``floor`` (``max(int(r K), 1)``, SLT's
  re-implementation, ``k1l1/SLT utils/heterofl_submodel.py``).
- ``scaler``: the ``Scaler`` module (paper Sec. 3.2; ``modules/modules.py``): in training every
  narrowed layer's output is divided by r (the code divides before every norm, on its ResNets
  the residual sum before each block's first norm: the same numbers, the sum being linear); at
  evaluation it is the identity. Before a BatchNorm it changes little (only through eps).
- ``masked_loss``: the masking trick (``models/resnet.py`` forward, ``cfg['mask']``): in local
  training the logits of classes the client has no sample of are set to 0 before the
  cross-entropy.
- ``label_split``: a client sends the output layer's rows (weight and bias) of the classes it
  has samples of only, and the server averages each row over the clients that sent it
  (``combine``'s ``label_split``, which the code always applies).

Set beside it, as the code runs: ``weighting: uniform`` (``combine`` is the plain mean over the
clients holding an entry; ``samples`` weighs them by their data) and ``clip_grad_norm: 1``
(``Local.train`` clips every step; without norm layers the Scaler's 1/r on a narrow client's
activations enlarges its gradients, and SGD at the config's lr may diverge without it).

Left out, and why: the code's *static batch normalization* (sBN: at evaluation the global
model's BatchNorm statistics are recomputed on the training set, ``train_classifier_fed.py``
``stats``) needs the training data on the server, which no evaluation hook gives an algorithm;
fedbug evaluates BatchNorm (``track_running_stats=False``) with the test batch's statistics, as
FedRolex's re-implementation does. The code's MultiStep learning-rate schedule is the config's
``lr_decay``'s to approximate. Models need per-channel norms (BatchNorm without running
statistics): the GroupNorm of the README's CIFAR line cannot be masked exactly and is refused.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import Field, field_validator
from torch import Tensor

from fedbug.algorithms.base import ALGORITHMS, Params
from fedbug.algorithms.fjord.od import flat_mask
from fedbug.algorithms.width import planner
from fedbug.algorithms.width.base import WidthAlgorithm, WidthClient
from fedbug.core.device import from_host
from fedbug.core.seeding import torch_generator
from fedbug.errors import ConfigError

if TYPE_CHECKING:
    from fedbug.core.protocol import ClientTask
    from fedbug.engine.client import ClientRuntime
    from fedbug.system import SystemModel

DEFAULT_RATES = [1.0, 0.5, 0.25, 0.125, 0.0625]


class HeteroFLParams(Params):
    """The config's ``heterofl:`` block."""

    block: ClassVar[str] = "heterofl"  # the block's name in messages (a subclass's its own)

    # defaults by keyword: mypy's dataclass_transform reading of pydantic sees only
    # ``default=`` (a positional default leaves the field required to it)

    rates: list[float] | dict[float, int] = Field(
        default_factory=lambda: list(DEFAULT_RATES),
        description="the rates in (0, 1] (equal shares), or rate -> share; 1 must be one of them",
    )
    assign: Literal["fixed", "dynamic", "by_ability"] = Field(
        default="fixed",
        description="fixed: client-id blocks (the code's fix); dynamic: drawn every round; "
        "by_ability: the fixed blocks over the clients, fastest first",
    )
    rounding: Literal["ceil", "floor"] = Field(
        default="ceil", description="ceil(r K) channels (paper, code) or max(int(r K), 1) (SLT's)"
    )
    scaler: bool = Field(default=True, description="divide activations by r in training (Scaler)")
    masked_loss: bool = Field(
        default=True, description="zero the logits of classes the client lacks"
    )
    label_split: bool = Field(default=True, description="send only the output rows of own classes")

    @field_validator("rates")
    @classmethod
    def _check_rates(cls, v: list[float] | dict[float, int]) -> list[float] | dict[float, int]:
        rates = list(v)
        if not rates:
            raise ValueError(f"{cls.block}.rates needs at least one rate, e.g. [1, 0.5]")
        bad = [r for r in rates if not 0.0 < r <= 1.0]
        if bad:
            raise ValueError(f"every {cls.block} rate must be in (0, 1]; got {bad}")
        if len(set(rates)) != len(rates):
            raise ValueError(f"{cls.block}.rates lists a rate twice: {rates}")
        if 1.0 not in rates:
            raise ValueError(
                f"{cls.block}.rates are relative to the global model, so 1 must be one of them; "
                f"got {rates}, e.g. {[1.0, *rates]}"
            )
        if isinstance(v, dict) and any(int(s) < 1 for s in v.values()):
            raise ValueError(f"{cls.block}.rates shares must be whole numbers >= 1; got {v}")
        return v

    def table(self) -> list[tuple[float, int]]:
        """(rate, share) in the order listed."""
        if isinstance(self.rates, dict):
            return [(float(r), int(s)) for r, s in self.rates.items()]
        return [(float(r), 1) for r in self.rates]


def assign_rates(order: Sequence[int], table: Sequence[tuple[float, int]]) -> list[float]:
    """Every client's rate, the clients taken in ``order``: ``len(order) // sum(shares)``
    clients per share in the order of ``table``, the clients left over the last rate (the
    authors' ``process_control`` for ``fix``, ``order`` = the client ids)."""
    n = len(order)
    per = n // sum(s for _, s in table)
    rates = [r for r, s in table for _ in range(per * s)]
    rates += [table[-1][0]] * (n - len(rates))
    out = [0.0] * n
    for client, rate in zip(order, rates):
        out[client] = rate
    return out


def draw_rate(table: Sequence[tuple[float, int]], seed: int, round: int, client: int) -> float:
    """A rate drawn with probabilities proportional to the shares (``dynamic``), from the
    generator of (seed, round, client)."""
    gen = torch_generator(seed, "heterofl-rate", round, client)
    shares = torch.tensor([float(s) for _, s in table])
    return table[int(torch.multinomial(shares / shares.sum(), 1, generator=gen))][0]


@ALGORITHMS.register("heterofl")
class HeteroFL(WidthAlgorithm):
    """HeteroFL: static nested width sub-models (client half :class:`HeteroFLClient`)."""

    name = "heterofl"
    loss_per_sample = False  # the loss reads the client's class counts / classes present
    params_cls = HeteroFLParams
    params: HeteroFLParams

    def __init__(self, global_lr: float = 1.0, params: Any = None) -> None:
        super().__init__(global_lr, params)
        self._num_clients: int | None = None
        self._rates: list[float] | None = None

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        """Why this width method cannot run with ``cfg``, or None (its own block's options)."""
        name = cls.name
        p = cfg.options(name) or cls.params_cls()
        if cfg.upload != "partial":
            return (
                f"{name} clients send their sub-model only; use upload: partial (the default), "
                f"not upload: {cfg.upload}"
            )
        if p.assign == "by_ability" and (cfg.system is None or cfg.system.abilities == "none"):
            return (
                f"{name}.assign: by_ability gives the fastest clients the largest rates, which "
                "needs a system: block with abilities: uniform or tiers (or use assign: fixed)"
            )
        if cfg.system is not None and cfg.system.cost != "flops":
            return f"{name} charges each client its sub-model's FLOPs; use system.cost: flops"
        if cfg.task != "classification" and (p.masked_loss or p.label_split):
            return (
                f"{name}.masked_loss and {name}.label_split act on class labels, which task "
                f"{cfg.task} does not have; set both to false"
            )
        return None

    def index_sets(self, key: Hashable) -> dict[str, Tensor]:
        """The first ``kept(r, K)`` channels of every group at rate ``key``."""
        if self.plan is None:
            raise RuntimeError("heterofl: wrap_model must come before the sub-models")
        return planner.prefix_sets(self.plan, float(key), self.params.rounding)  # type: ignore[arg-type]

    def width_costs(self, model: Any, x: Tensor, y: Tensor) -> dict[float, float]:
        """Per-sample training FLOPs of every rate's narrow network."""
        names = [n for n, _ in model.named_parameters()]
        return {r: self.step_flops(model, r, names, x, y) / len(y) for r, _ in self._table()}

    def setup_system(self, system: Any, model: Any, x: Tensor, y: Tensor) -> dict[str, Any]:
        """Each rate's per-sample training FLOPs, for the summary (``width_costs``)."""
        return {"width_costs": {str(r): c for r, c in self.width_costs(model, x, y).items()}}

    def _table(self) -> list[tuple[float, int]]:
        return self.params.table()

    # -- the server's round config --------------------------------------------------------
    def init_server_state(self, weights: Tensor, num_clients: int) -> dict[str, Tensor]:
        """No state; the server half learns the number of clients (the fixed blocks' size)."""
        self._num_clients = num_clients
        return {}

    def client_config(self, client: int, system: SystemModel | None) -> dict[str, Any]:
        """Client ``client``'s ``width`` (none under ``dynamic``: the client draws it)."""
        assign = self.params.assign
        if assign == "dynamic":
            return {}
        if self._rates is None:
            if assign == "by_ability":
                if system is None:
                    raise ConfigError("heterofl.assign: by_ability needs a system: block")
                ab = system.abilities.tolist()
                order = sorted(range(len(ab)), key=lambda k: (-float(ab[k]), k))
                table = sorted(self._table(), key=lambda t: -t[0])
            else:
                if self._num_clients is None:
                    raise RuntimeError("heterofl: init_server_state must come first")
                order, table = list(range(self._num_clients)), self._table()
            self._rates = assign_rates(order, table)
        return {"width": self._rates[client]}

    def start_client(
        self,
        task: ClientTask,
        labels: Tensor,
        runtime: ClientRuntime | None = None,
        gen: torch.Generator | None = None,
    ) -> HeteroFLClient:
        if runtime is None:
            raise ValueError(f"{self.name}: a client session needs the worker's runtime")
        return HeteroFLClient(self, task, labels, runtime, self.client_rate(task))

    def client_rate(self, task: ClientTask) -> float:
        """The client's rate this round: the one it was sent (``width``), else (``dynamic``)
        drawn from the generator of (seed, round, client)."""
        if "width" in task.extra:
            return float(task.extra["width"])
        return draw_rate(self._table(), task.seed, task.round, task.client)


class HeteroFLClient(WidthClient):
    """One client's round at rate r: the sub-model, the Scaler, the masked loss, its rows."""

    alg: HeteroFL

    def __init__(
        self, alg: HeteroFL, task: ClientTask, labels: Tensor, runtime: ClientRuntime, rate: float
    ) -> None:
        p = alg.params
        super().__init__(alg, task, labels, runtime, rate, rate if p.scaler else 1.0)
        self.rate = rate
        classes = 0
        if alg.inner is not None:
            weight = alg.inner.get_submodule(alg.classifier).weight
            assert isinstance(weight, Tensor)  # the classifier layer's weight: [classes, ...]
            classes = int(weight.shape[0])
        self.present = torch.zeros(classes, dtype=torch.bool)
        self.present[labels.unique().cpu()] = True
        self._present_on: Tensor | None = None  # on the outputs' device, moved once

    def loss(self, output: Any, y: Tensor) -> Tensor:
        """Cross-entropy, the logits of classes without a sample here set to 0 under
        ``masked_loss``."""
        if self.alg.params.masked_loss:
            if self._present_on is None or self._present_on.device != output.device:
                self._present_on = from_host(self.present, output.device)
            output = output.masked_fill(~self._present_on, 0.0)
        return self.alg.loss(output, y)

    def sent(self, held: Tensor) -> Tensor:
        """Under ``label_split``, less the output layer's rows of the classes it lacks."""
        if not self.alg.params.label_split or bool(self.present.all()):
            return held
        name = self.alg.classifier
        head = self.alg.inner.get_submodule(name)  # type: ignore[union-attr]
        rows = {
            f"{name}.{pname}": self.present.reshape(-1, *[1] * (p.dim() - 1)).expand(p.shape)
            for pname, p in head.named_parameters(recurse=False)
        }
        return held & flat_mask(self.rt.space, rows, "model.").to(held.device)

    def finish(self, result: Any) -> None:
        super().finish(result)
        result.figures["width"] = self.rate
