"""APF, adaptive parameter freezing (Chen et al., ICDCS 2021), as the authors' code computes it.

Every scalar entry of the model has a stability figure, the *effective perturbation*
P = |E| / A, where E and A are exponential moving averages (factor alpha, ``ema_alpha``) of the
entry's change per synchronisation g and of |g|: near 1 an entry moves steadily one way, near 0
it oscillates in place. At each check (every round: a round is one synchronisation period, the
authors' 100 local iterations being ``local_steps: 100``; the code's ``freezing_check_frequency``
is 1 and never read) each entry that was active is refreshed:

    g = w_before - w_after,   E = alpha E + (1 - alpha) g,   A = alpha A + (1 - alpha) |g|,
    length = length + 1 if P < T_s else length // 2,   thaw = check + length + 1,

then ``check`` advances and an entry is active exactly when ``thaw == check``: an entry found
stable is frozen for ``length`` rounds, a length that grows by one each time it is found stable
again (additive increase) and halves when it is not (multiplicative decrease); length 0 is
active. When more than ``tighten_at`` of the entries are frozen after a check, T_s halves (at
every such check, so it can halve again). Frozen entries are neither trained nor sent: a client
trains the whole model and puts every frozen entry back to the value it received after every
local step (whatever weight decay, momentum or Adam moved it by; an optimiser's own state for a
frozen entry goes on as under one optimiser for the whole model, as in the authors' code, so
momentum is allowed), sends only the active entries (4 bytes each) and receives only them; the
server averages each active entry over the clients that sent it (``weighting``, ``global_lr``)
and keeps every frozen entry bitwise.

Reference: the authors' chenc10/APF_Release, ``sync_manager.py`` ``APF_Interlayer`` (commit
``e94173b``, the 2021 release; the comparison in ``benchmarks/equivalence/run_apf.py``). The
paper states the rule in these terms (effective perturbation with EMA, AIMD freezing periods,
a threshold tightened once most parameters are stable, an "aggressive" variant freezing at
random); its defaults are the code's: alpha 0.99, T_s 0.05, tighten at 80% frozen, no random
freezing. Where fedbug differs, and why:

- Statistics live on the server (the same for every client), which also makes partial
  participation well defined; in the code every worker computes them itself, identically under
  full participation (its all-reduce).
- Scope: every entry of the flat weight vector the server holds, float buffers (BatchNorm's
  running statistics) included, which the server cannot tell apart from parameters here; the
  code covers ``model.parameters()`` and never synchronises buffers. Models without float
  buffers (fedbug's CNNs, MLP, LSTM, GroupNorm ResNet) are the same either way.
- An active entry no client sent (a freeze policy froze its unit on every client) keeps its
  statistics and stays active for the next round: no change is no evidence of stability. The
  code has no freeze policy.
- Bytes: a client is charged 4 bytes per active entry each way, as a worker of the code that
  keeps its model between rounds (every worker every round) exchanges them; the mask is not
  counted (each such worker computes it).
- ``random_freezing`` (the aggressive variant; off in the released code's profile):
  ``release2021``, the released ``randomly_freeze_active_params`` (its call passes an argument
  the definition does not take, so the code as released raises; called as its later fix does):
  each entry just checked is held ``int(u)`` rounds more when u = 100 U(0, 1) < check / 20
  (so never up to check round 20); ``head2022`` (commit ``b67fd17``): every entry, frozen or
  not, one round more with probability 1/2. The server draws them from a generator addressed
  by (the digest of the initial global weights, which the run's seed draws, and the round): the
  server half has no seed of its own; in the code every worker draws its own, so their masks
  part.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field, field_validator
from torch import Tensor

from fedbug.algorithms.base import ALGORITHMS, Algorithm, ClientSession, Params, ServerStep
from fedbug.core.seeding import torch_generator

if TYPE_CHECKING:
    from fedbug.config import BaseConfig
    from fedbug.core.protocol import ClientResult, ClientTask
    from fedbug.engine.aggregate import Aggregate
    from fedbug.engine.client import ClientRuntime


class APFParams(Params):
    """The config's ``apf:`` block (the authors' ``InterlayerProfileDict['APF']``)."""

    ema_alpha: float = Field(0.99, ge=0.0, lt=1.0, description="alpha of the EMAs E and A")
    stable_threshold: float = Field(
        0.05, gt=0.0, description="T_s: an entry with P = |E|/A below it is stable (frozen)"
    )
    tighten_at: float = Field(
        0.8, gt=0.0, le=1.0, description="T_s halves after a check leaving more than this frozen"
    )
    random_freezing: Literal["none", "release2021", "head2022"] = Field(
        "none",
        description="the aggressive variant: none, as released (release2021) or as the code's "
        "later commit b67fd17 (head2022)",
    )

    @field_validator("random_freezing", mode="before")
    @classmethod
    def _off_is_none(cls, v: Any) -> Any:
        """YAML reads ``off``/``false``/``no`` as False: that is ``none``."""
        if v is False:
            return "none"
        if v is True:
            raise ValueError("give a variant: none, release2021 or head2022 (true names none)")
        return v


@ALGORITHMS.register("apf")
class APF(Algorithm):
    """Server half: the statistics and the active mask (:meth:`payload`); client half
    :class:`APFClient`: restore frozen entries after every step, send the active ones."""

    name = "apf"
    params_cls = APFParams
    params: APFParams
    sends_sub_models = True  # its active entries

    @classmethod
    def check_config(cls, cfg: BaseConfig) -> str | None:
        """APF's saving is what clients do not send: an upload of whole units would hide it."""
        if cfg.upload != "partial":
            return (
                "apf clients send only their active entries; use upload: partial (the default), "
                f"not upload: {cfg.upload}"
            )
        return None

    # -- server half ---------------------------------------------------------------------
    def init_server_state(self, weights: Tensor, num_clients: int) -> dict[str, Tensor]:
        """Per entry E = A = 0, length 0, thaw round 0; check round 0 (every entry active), T_s;
        ``seed``: the digest of the initial weights, which addresses the random draws."""
        n = weights.numel()
        digest = hashlib.blake2b(weights.detach().cpu().numpy().tobytes(), digest_size=8)
        return {
            "ema": torch.zeros(n),
            "abs_ema": torch.zeros(n),
            "length": torch.zeros(n, dtype=torch.int32),
            "thaw": torch.zeros(n, dtype=torch.int32),
            "check": torch.tensor(0, dtype=torch.int64),
            "threshold": torch.tensor(self.params.stable_threshold, dtype=torch.float64),
            "seed": torch.tensor(int.from_bytes(digest.digest(), "little") >> 1),
        }

    def payload(self, server_state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The active mask: entries whose thaw round is the current check round."""
        return {"active": active_mask(server_state)}

    def server_update(
        self,
        weights: Tensor,
        agg: Aggregate,
        state: dict[str, Tensor],
        round: int,
        num_clients: int,
    ) -> ServerStep:
        """w <- w + eta_g * mean over the clients that sent each entry (frozen entries kept
        bitwise), then the check: statistics of the entries refreshed, T_s tightened."""
        active = active_mask(state)
        held = agg.entries_held() & active
        new = torch.where(held, weights + self.global_lr * agg.mean_delta(), weights)
        nxt = self.check(state, weights - new, held, active & ~held, round)
        frozen_now = 1.0 - float(active.sum()) / active.numel()
        metrics = {"apf_frozen": frozen_now, "apf_threshold": float(nxt["threshold"])}
        return ServerStep(new, new, nxt, metrics)

    def check(
        self, state: dict[str, Tensor], g: Tensor, refresh: Tensor, unsent: Tensor, round: int
    ) -> dict[str, Tensor]:
        """The next state after one check (``sync_manager.py:83-110``): the entries in
        ``refresh`` take the change ``g`` into E and A and get a new length and thaw round;
        those in ``unsent`` (active, sent by no client) stay active; then the check round
        advances and T_s halves if more than ``tighten_at`` of the entries are frozen."""
        p = self.params
        a = p.ema_alpha
        s = {k: v.clone() for k, v in state.items()}
        check = int(state["check"])
        idx = refresh.nonzero().squeeze(1)
        e = s["ema"][idx] * a + g[idx] * (1.0 - a)
        m = s["abs_ema"][idx] * a + torch.abs(g[idx]) * (1.0 - a)
        s["ema"][idx], s["abs_ema"][idx] = e, m
        length = s["length"][idx]
        stable = torch.abs(e) / m < float(state["threshold"])  # 0/0 (never moved): not stable
        s["length"][idx] = torch.where(stable, length + 1, length // 2)
        s["thaw"][idx] = (check + s["length"][idx] + 1).to(torch.int32)
        s["thaw"][unsent] = check + 1
        self.random_freezing(s, idx, check, round)
        s["check"] = torch.tensor(check + 1, dtype=torch.int64)
        active = active_mask(s)
        ratio = 1 - active.sum().float() / active.numel()  # float32, as the code
        if bool(ratio > p.tighten_at):
            s["threshold"] = state["threshold"] / 2.0
        return s

    def random_freezing(self, s: dict[str, Tensor], idx: Tensor, check: int, round: int) -> None:
        """The aggressive variant, in place on ``s["thaw"]`` (``idx``: the entries just
        checked; ``check``: the check round before it advances)."""
        variant = self.params.random_freezing
        if variant == "none":
            return
        gen = torch_generator(int(s["seed"]), "apf", round)
        if variant == "release2021":
            u = torch.rand(idx.numel(), generator=gen) * 100
            extra = torch.where(u < check / 20.0, u.int(), torch.zeros((), dtype=torch.int32))
            s["thaw"][idx] += extra
        else:
            s["thaw"] += (torch.rand(s["thaw"].numel(), generator=gen) < 0.5).int()

    # -- client half ---------------------------------------------------------------------
    def start_client(
        self,
        task: ClientTask,
        labels: Tensor,
        runtime: ClientRuntime | None = None,
        gen: torch.Generator | None = None,
    ) -> APFClient:
        if runtime is None:
            raise ValueError("apf: a client session needs the worker's runtime")
        return APFClient(self, task, labels, runtime)


def active_mask(state: dict[str, Tensor]) -> Tensor:
    """Bool per entry: active (trained and sent) this round, thaw round == check round."""
    return state["thaw"] == state["check"]


class APFClient(ClientSession):
    """One client's round: frozen entries put back after every step; active ones sent."""

    alg: APF

    def __init__(self, alg: APF, task: ClientTask, labels: Tensor, runtime: ClientRuntime) -> None:
        if "active" not in task.payload:
            raise ValueError("apf: the server sends each client the active mask (payload 'active')")
        super().__init__(alg, task, labels)
        self.rt = runtime
        self.active = task.payload["active"].to(runtime.flat.device)
        self.saved = runtime.flat.clone()  # the received values (no read-back: stays on device)

    def after_step(self) -> None:
        """Put the frozen entries back (weight decay, momentum moved them)."""
        torch.where(self.active, self.rt.flat, self.saved, out=self.rt.flat)

    def finish(self, result: ClientResult) -> None:
        """The entries held (the active ones), 4 bytes per active entry of the units sent up
        and of the shared units down, the active parameters of the trained units."""
        space = self.rt.space
        per_unit = [int(self.active[s].sum()) for s in space.unit_slices]
        shared = self.alg.shared_mask(space.num_units)
        params = 0
        for off, n, is_param, u in zip(space.offsets, space.numels, space.is_param, space.unit_of):
            if is_param and result.trained[u]:
                params += int(self.active[off : off + n].sum())
        result.entries = self.active
        result.bytes_up = 4 * sum(c for c, up in zip(per_unit, result.uploaded) if up)
        result.bytes_down = 4 * sum(c for c, sh in zip(per_unit, shared) if sh)
        result.trained_params = params
