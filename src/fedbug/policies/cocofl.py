"""CoCoFL (Pfeiffer et al., "CoCoFL: Communication- and Computation-Aware Federated Learning via
Partial NN Freezing and Quantization", TMLR 2023): each device trains one contiguous block of
units, the units before and after it frozen, the largest its resources allow.

Every round each selected device k picks its *configuration*, the units lo..hi it trains, from
the blocks whose cost fits its limits, all relative to training every unit:

    feasible_k = {[lo, hi] : time_k(lo, hi) <= T_k, data(lo, hi) <= D_k, memory(lo, hi) <= M}
    maximal_k  = {b in feasible_k : no other feasible block contains b}
    [lo, hi]   ~ uniform over maximal_k

(the authors' ``filter_table`` keeps the configurations whose trained set is no strict subset of
another feasible one, then ``random.choice``). Costs are fedbug's own counts, not profiled
tables: ``time_k`` is the client's model exchange time in the simulated system (the full model
down, the shared units of the block up, E epochs of the block's training FLOPs, at the speeds of
its ability: :meth:`SystemModel.time`) over its time with every unit trained; ``data`` the upload
bytes of the block over the full upload; ``memory`` one training step's bytes (the model, the
activations autograd saves, the trained units' gradients and optimiser state:
:meth:`fedbug.system.UnitCosts.memory`) over those of full training. The limits
(``cocofl: {...}``):

* ``deadline`` T: the round's deadline in the system's time units; T_k = T / time_k(full), so
  a block fits when the client finishes it by T. Unset: the shortest deadline every client can
  meet (the slowest client trains its cheapest block, faster ones more).
* ``data``: D_k, the upload limit as a fraction of the full upload; ``[lo, hi]`` draws it
  uniformly per device and round (the authors' medium and weak devices draw U(0.5, 1)).
* ``memory``: M, the same fraction for every device.

The draws (D_k, then the block) come from a generator addressed by (seed, round, client), on
the client, so every executor draws the same and a resume repeats them. The server averages
Algorithm 2: w <- w + (1/|C|) sum over the devices that trained a unit of their change, which
is ``aggregation: full, weighting: uniform`` (the ``method: cocofl`` preset).

Named differences from the authors' code (k1l1/CoCoFL at fa27499):

* **No quantisation.** The reference runs frozen blocks before the trained ones in int8
  (``QFW*``, BatchNorm folded into the convolutions with its running statistics) and those after
  them in int8 forward and backward (``QBW*``); fedbug runs every frozen unit in float32 with
  ``requires_grad`` off (gradients still pass through the frozen units after the block, as
  through QBW), and charges their float32 FLOPs: the reference's speed-up from int8 is not
  simulated, and its numbers differ from fp32 by the quantisation error.
* **BatchNorm.** The folded BatchNorm of a quantised block never updates its running statistics;
  fedbug's frozen units run in train mode, normalise with the batch's statistics and move their
  running statistics locally. The server never sees them: a frozen unit is not sent, and under
  ``aggregation: full`` it counts as unchanged (its local drift included), as the reference's
  frozen running statistics are.
* **Profiled tables.** The reference reads time, data and memory per configuration from tables
  profiled on its devices (e.g. ``table__CoCoFL_arm_QResNet18.json``), time being training time
  only, with data limits drawn by ``torch.rand`` and fixed tiers by device id (a third each of
  (1, 1, 1), (0.66, U(0.5, 1), 0.66), (0.33, U(0.5, 1), 0.33)). fedbug counts every block of the
  model it trains and takes the time limit from the system model's abilities and the deadline.
  :func:`select_blocks` is the reference's selection rule, fed any table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from pydantic import Field, field_validator

from fedbug.core.flops import optimizer_state_copies
from fedbug.core.seeding import torch_generator
from fedbug.errors import ConfigError
from fedbug.policies.base import POLICIES, FreezePolicy, PolicyParams, PolicySession, StepCtx

if TYPE_CHECKING:
    from fedbug.core.protocol import ClientResult, ClientTask
    from fedbug.system import SystemModel

Block = tuple[int, int]  # trained units lo..hi, 0-based, inclusive


class CoCoFLParams(PolicyParams):
    """The config's ``cocofl:`` block: each device's limits."""

    deadline: float | None = Field(
        None,
        gt=0.0,
        allow_inf_nan=False,
        description="round deadline T in system time units (unset: the shortest every client "
        "meets)",
    )
    data: tuple[float, float] = Field(
        (1.0, 1.0),
        description="upload limit, a fraction of the full upload; [lo, hi]: drawn uniformly per "
        "device and round",
    )
    memory: float = Field(
        1.0, gt=0.0, le=1.0, description="memory limit, a fraction of full training's"
    )

    @field_validator("data", mode="before")
    @classmethod
    def _one_value(cls, v: Any) -> Any:
        return (v, v) if isinstance(v, int | float) else v

    @field_validator("data")
    @classmethod
    def _in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        lo, hi = v
        if not 0.0 < lo <= hi <= 1.0:
            raise ValueError(f"give 0 < lo <= hi <= 1 (one value or [lo, hi]); got {list(v)}")
        return v


@dataclass(frozen=True)
class BlockCost:
    """One configuration: units ``lo``..``hi`` trained; its costs relative to full training."""

    lo: int
    hi: int
    time: float
    data: float
    memory: float


def maximal(blocks: Iterable[Block]) -> list[Block]:
    """The blocks no other block of ``blocks`` strictly contains, ascending."""
    found = set(blocks)
    return sorted(
        b for b in found if not any(c != b and c[0] <= b[0] and b[1] <= c[1] for c in found)
    )


def select_blocks(
    table: Iterable[BlockCost], time: float, data: float, memory: float
) -> list[Block]:
    """The reference's ``filter_table``: of the configurations within all three limits, those
    whose trained units are in no other's (a device then picks one uniformly)."""
    return maximal(
        (c.lo, c.hi) for c in table if c.time <= time and c.data <= data and c.memory <= memory
    )


def all_blocks(num_units: int) -> list[Block]:
    """Every contiguous block of ``num_units`` units, by first then last unit."""
    return [(lo, hi) for lo in range(num_units) for hi in range(lo, num_units)]


@POLICIES.register("cocofl")
class CoCoFL(FreezePolicy):
    """Each device trains the contiguous block of units it drew among the largest that fit its
    time, data and memory limits (server half: the block costs and each client's feasible
    blocks, sent in ``task.extra["cocofl"]``; client half: :class:`CoCoFLClient`)."""

    name = "cocofl"
    params_cls = CoCoFLParams
    params: CoCoFLParams

    def __init__(self, params: CoCoFLParams | None = None) -> None:
        super().__init__(params)
        self.deadline: float | None = None
        self._time: torch.Tensor | None = None  # [clients, blocks], time units
        self._fits: torch.Tensor | None = None  # [blocks], within the memory limit
        self._data: list[float] = []  # [blocks], upload over the full upload
        self._blocks: list[Block] = []

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        if cfg.system is None:
            return (
                "policy: cocofl needs a system: block (the devices whose limits choose blocks), "
                "e.g. system: {abilities: uniform}"
            )
        if cfg.system.cost != "flops":
            return "policy: cocofl counts each block's FLOPs; set system.cost: flops"
        if cfg.upload != "partial":
            return "policy: cocofl uploads only the trained block; set upload: partial"
        return None

    # -- client half ---------------------------------------------------------------------
    def trainable_units(self, ctx: StepCtx) -> range:
        """Every unit: the block is each client's own draw (:class:`CoCoFLClient`)."""
        return range(ctx.num_units)

    def start_client(self, task: ClientTask) -> CoCoFLClient:
        return CoCoFLClient(self, task)

    # -- server half ---------------------------------------------------------------------
    def setup_server(self, system: SystemModel | None, cfg: Any) -> None:
        if system is None or system.unit_costs is None:
            raise ConfigError(
                "policy: cocofl needs a system: block with cost: flops (its block costs)"
            )
        costs = system.unit_costs
        blocks = all_blocks(system.num_units)
        copies = optimizer_state_copies(cfg.optimizer, cfg.momentum)
        per_sample = [costs.flops(range(lo, hi + 1)) for lo, hi in blocks]
        up = [system.upload_bytes_of(range(lo, hi + 1)) for lo, hi in blocks]
        mem = [costs.memory(range(lo, hi + 1), cfg.batch_size, copies) for lo, hi in blocks]
        full = blocks.index((0, system.num_units - 1))
        self._blocks = blocks
        self._data = [u / up[full] if up[full] else 0.0 for u in up]
        self._fits = torch.tensor([m / mem[full] <= self.params.memory for m in mem])
        self._time = exchange_times(system, per_sample, up)
        lowest = torch.tensor([d <= self.params.data[0] for d in self._data])
        self.deadline = self._check_deadline(self._time, self._fits & lowest)

    def _check_deadline(self, time: torch.Tensor, fits: torch.Tensor) -> float:
        """T: the given deadline, or the shortest every client meets with a block that
        ``fits`` (the memory and the lowest data limit); a ConfigError where one cannot."""
        if not bool(fits.any()):
            p = self.params
            raise ConfigError(
                f"cocofl: no block of units fits cocofl.memory={p.memory:g} and cocofl.data="
                f"{p.data[0]:g} together; raise cocofl.memory or cocofl.data"
            )
        cheapest = time.masked_fill(~fits, float("inf")).min(dim=1)
        need, client = float(cheapest.values.max()), int(cheapest.values.argmax())
        given = self.params.deadline
        if given is None:
            return need
        if given < need:
            lo, hi = self._blocks[int(cheapest.indices[client])]
            raise ConfigError(
                f"cocofl.deadline={given:g} is too short for client {client}, whose cheapest "
                f"block (units {lo}..{hi}) takes {need:.4g} time units; raise cocofl.deadline to "
                f"at least {need:.4g} or leave it unset"
            )
        return float(given)

    def client_config(self, client: int) -> dict[str, Any]:
        """Client ``client``'s blocks within the deadline and the memory limit, each with its
        data fraction, and the data limit's range: the client draws the rest."""
        if self._time is None or self._fits is None or self.deadline is None:
            raise ValueError("policy cocofl: setup_server(system, cfg) must come first")
        ok = (self._time[client] <= self.deadline) & self._fits
        rows = [[lo, hi, self._data[i]] for i, (lo, hi) in enumerate(self._blocks) if ok[i]]
        return {"cocofl": {"blocks": rows, "data": list(self.params.data)}}

    def round_deadline(self) -> float | None:
        return self.deadline


def exchange_times(
    system: SystemModel, per_sample: Sequence[float], upload: Sequence[int]
) -> torch.Tensor:
    """[clients, blocks] float64: each client's model exchange time training each block (the
    full model down, the block's shared units up, E epochs of its FLOPs), as
    :meth:`SystemModel.time` charges it."""
    ps = torch.tensor(per_sample, dtype=torch.float64)
    up = torch.tensor(upload, dtype=torch.float64)
    a = system.abilities.to(torch.float64).unsqueeze(1)
    n = torch.tensor(system.client_sizes, dtype=torch.float64).unsqueeze(1)
    flops = system.local_epochs * n * ps
    return (system.full_bytes + up) / (system.bandwidth * a) + flops / (system.compute_speed * a)


class CoCoFLClient(PolicySession):
    """One client's configuration in one round: its data limit and block, drawn from a
    generator addressed by (seed, round, client)."""

    policy: CoCoFL

    def __init__(self, policy: CoCoFL, task: ClientTask) -> None:
        super().__init__(policy, task)
        conf = task.extra.get("cocofl")
        if conf is None:
            raise ValueError(
                f"policy cocofl needs task.extra['cocofl'] (the client's blocks) from the server; "
                f"round {task.round}, client {task.client} has keys {sorted(task.extra)}"
            )
        self.num_units = 0  # the policy's units, known at the first step
        self.data_limit, self.block, self.choices = draw_block(
            conf["blocks"], conf["data"], task.seed, task.round, task.client
        )

    def trainable_units(self, ctx: StepCtx) -> range:
        self.num_units = ctx.num_units
        lo, hi = self.block
        return range(min(lo, ctx.num_units - 1), min(hi, ctx.num_units - 1) + 1)

    def finish(self, result: ClientResult) -> None:
        """The block (figures ``block_lo``, ``block_hi``) and how many units it left frozen
        (``n_frozen``, what the reputation selection's U_sys and the round line read)."""
        lo, hi = self.block
        result.figures["block_lo"], result.figures["block_hi"] = lo, hi
        result.figures["n_frozen"] = max(self.num_units - (hi - lo + 1), 0)
        choices = [list(b) for b in self.choices]
        result.info["cocofl"] = {"data_limit": self.data_limit, "choices": choices}


def draw_block(
    rows: Sequence[Sequence[float]], data: Sequence[float], seed: int, round: int, client: int
) -> tuple[float, Block, list[Block]]:
    """(the data limit D ~ U(lo, hi), the drawn block, the maximal blocks it was drawn from)
    for ``rows`` of [lo, hi, data fraction], from the generator (seed, "cocofl", round,
    client)."""
    gen = torch_generator(seed, "cocofl", round, client)
    low, high = float(data[0]), float(data[1])
    limit = low + (high - low) * float(torch.rand((), generator=gen, dtype=torch.float64))
    choices = maximal((int(r[0]), int(r[1])) for r in rows if float(r[2]) <= limit)
    if not choices:
        raise ValueError(f"cocofl: no block within the data limit {limit:.4g} ({len(rows)} sent)")
    pick = int(torch.randint(len(choices), (), generator=gen))
    return limit, choices[pick], choices
