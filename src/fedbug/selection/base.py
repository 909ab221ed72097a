"""What a client selection is: which clients join round r (draws from (seed, "select", r)),
and what it learns from each round."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

from fedbug.core.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor

    from fedbug.config import BaseConfig
    from fedbug.core.units import ParamSpace
    from fedbug.system import SystemModel


@dataclass(frozen=True, kw_only=True)
class SelectionFeedback:
    """What round ``round`` produced, handed to a stateful selection's ``update`` after
    aggregation. Only ``round``, ``clients`` and ``num_clients`` are always needed; each
    selection says which other fields it reads (``reputation``: ``num_units``, ``space``,
    ``figures``, ``trained``, ``local_deltas``, ``global_delta``; ``rbcsf``: optionally
    ``times``).

    ``local_deltas[k]`` is w^k_{r+1} - w_r and ``global_delta`` w_{r+1} - w_r, full flat vectors
    of the :class:`~fedbug.core.units.ParamSpace`; ``trained[k][l]`` says whether client k trained
    unit l; ``figures[k]`` the per-client figures its methods reported
    (:attr:`~fedbug.core.protocol.ClientResult.figures`, e.g. how many units its policy froze);
    ``times[k]`` its full-model time tau_k.
    """

    round: int
    clients: list[int]
    num_clients: int
    figures: dict[int, dict[str, float]] = field(default_factory=dict)
    num_units: int = 0
    space: ParamSpace | None = None
    local_deltas: dict[int, Tensor] = field(default_factory=dict)
    trained: dict[int, list[bool]] = field(default_factory=dict)
    global_delta: Tensor | None = None
    times: dict[int, float] = field(default_factory=dict)


SELECTIONS: Registry[type[Selection]] = Registry("selection")


class Selection:
    """Base of every client selection; picks round r's clients (ascending ids), with draws
    from ``numpy_rng(seed, "select", r)``.

    Every hook the engine calls is declared here; a stateless selection overrides ``select``
    (and ``build``) only. A *stateful* one (FreezeFL's ``reputation``, ``rbcsf``) also overrides
    ``update`` (called once a round, after aggregation, with what the round produced),
    ``state_dict`` / ``load_state_dict`` (everything an exact resume needs: plain values and
    torch tensors, so a checkpoint loads with ``weights_only=True``) and ``client_utility`` (a
    client's
    current standing, recorded per client). Options come from ``params_cls``, a config block
    named after the selection; ``check_config`` says why a config cannot use it.
    """

    name: ClassVar[str] = "base"
    params_cls: ClassVar[type[BaseModel] | None] = None
    #: whether ``update`` reads ``feedback.local_deltas`` (the round then keeps every client's
    #: update until it ends, instead of dropping each once aggregated; without it they are
    #: empty): needs ``update``, checked when the class is defined
    needs_local_deltas: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own_update = inspect.getattr_static(cls, "update") is not Selection.__dict__["update"]
        if cls.needs_local_deltas and not own_update:
            raise TypeError(
                f"selection class {cls.__qualname__} sets needs_local_deltas = True but does not "
                "override update, the hook that reads feedback.local_deltas; override update or "
                "remove the line"
            )

    @classmethod
    def check_config(cls, cfg: BaseConfig) -> str | None:
        """Why ``cfg`` cannot use this selection, or None."""
        return None

    @classmethod
    def build(cls, cfg: BaseConfig, num_clients: int, system: SystemModel | None) -> Selection:
        """The selection for a run (``system``: the simulated devices, or None)."""
        raise NotImplementedError

    def select(self, round: int, seed: int, num_clients: int) -> list[int]:
        raise NotImplementedError

    def update(self, feedback: SelectionFeedback) -> None:
        """What round ``feedback.round`` produced; nothing by default."""
        return None

    def client_utility(self, client: int) -> float | None:
        """Client ``client``'s current standing (reputation's u_k), None for none."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
