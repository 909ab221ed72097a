"""What travels between the server and a client, typed: the round config one client receives
(:class:`ClientTask`), its data (:class:`ClientData`), the run's fixed local-training settings
(:class:`TrainSettings`) and what it sends back (:class:`ClientResult`).

These sit below the methods (algorithms, policies, selections read them) and above nothing but
torch, so every executor (in-process, worker processes, Flower) carries the same objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from torch import Tensor

if TYPE_CHECKING:
    from fedbug.core.flops import StepMemory


@dataclass(frozen=True)
class SampleDP:
    """Sample-level DP-SGD's client settings (the ``dp_sgd:`` block; see
    :mod:`fedbug.engine.privacy.sample_level`)."""

    clip: float
    noise_multiplier: float
    sampling: str = "poisson"


@dataclass(frozen=True)
class TrainSettings:
    """Local-training settings that stay fixed for a run."""

    local_epochs: int = 5
    local_steps: int | None = None
    batch_size: int = 50
    optimizer: str = "sgd"
    momentum: float = 0.0
    weight_decay: float = 1e-3
    clip_grad_norm: float | None = None
    count_flops: bool = True
    dp_sgd: SampleDP | None = None
    upload: str = "partial"  # partial: the trained shared units are sent; full: every shared unit


@dataclass(frozen=True)
class ClientTask:
    """The per-round config one client receives with the weights."""

    round: int
    client: int
    seed: int
    lr: float
    mean_samples: float
    payload: dict[str, Tensor] = field(default_factory=dict)
    rounds: int = 1
    extra: dict[str, Any] = field(default_factory=dict)  # per-client round config from methods


@dataclass
class ClientData:
    """One client's raw training samples (a batch is an index into them)."""

    x: Tensor
    y: Tensor

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class ClientResult:
    """What one client sends back after a round: typed fields, read by the server by name.

    ``delta`` is the full-length change of the local weights (entries of units not sent are
    ignored); ``trained[u]`` says unit u trained at least one step, ``uploaded[u]`` that its delta
    is sent (the trained shared units; every shared unit under ``upload: full``). Costs:
    ``flops`` of local training, of which ``probe_flops`` a policy's discarded probe did (not
    charged); ``bytes_up`` sent and ``bytes_down`` received (None: the round's download);
    ``charged_time`` a policy's own figure of the client's simulated time (None: from the
    costs). ``entries`` (bool, full-length) the entries of its units it holds, None: all.
    Memory (counted where FLOPs are, 0 where not): its costliest local step's bytes of saved
    activations, gradients and optimiser state for the trained parameters (``mem_activations``,
    ``mem_gradients``, ``mem_optimizer``; :class:`fedbug.core.flops.StepMemory`), summed as
    :attr:`peak_mem`.

    Two declared channels carry what a method adds, so that no shared module names a method's
    fields: ``extras``, tensors the server sums per key over the round's clients
    (:meth:`fedbug.engine.aggregate.Aggregate.extra_sum`; SCAFFOLD's control-variate change), and
    ``figures``, a method's per-client numbers by name (how many units a policy froze, a
    sub-model's width, a system utility ``u_sys`` for a selection): recorded in the round's
    ``per_client`` entries on a simulated system and handed to the selection
    (:class:`~fedbug.selection.SelectionFeedback`). ``info`` holds a method's per-client values
    that are only recorded (on Flower, carried as JSON), never read by the server.
    """

    client: int
    num_samples: int
    delta: Tensor
    trained: list[bool]
    state: dict[str, Tensor]
    train_loss: float | None = None
    steps: int = 0
    flops: int = 0
    probe_flops: int = 0
    probe_steps: int = 0
    mem_activations: int = 0
    mem_gradients: int = 0
    mem_optimizer: int = 0
    trained_params: int = 0
    bytes_up: int = 0
    bytes_down: int | None = None
    charged_time: float | None = None
    entries: Tensor | None = None
    extras: dict[str, Tensor] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    uploaded: list[bool] = field(default_factory=list)
    state_reset: bool = False

    def __post_init__(self) -> None:
        if not self.uploaded:
            self.uploaded = list(self.trained)

    @property
    def peak_mem(self) -> int:
        """Bytes of its costliest local step: activations + gradients + optimiser state."""
        return self.mem_activations + self.mem_gradients + self.mem_optimizer

    def set_peak_mem(self, step: StepMemory | None) -> None:
        """Its costliest local step's memory (None: not counted, all 0)."""
        self.mem_activations = step.activations if step is not None else 0
        self.mem_gradients = step.gradients if step is not None else 0
        self.mem_optimizer = step.optimizer if step is not None else 0
