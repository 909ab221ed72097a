"""What the server keeps per client between rounds: algorithm state, latest local models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor

from fedbug.algorithms import Algorithm
from fedbug.core.units import ParamSpace
from fedbug.engine.state_store import LAYOUT, Layout, StateStore, read_layout
from fedbug.errors import CheckpointError

#: Client state is kept in an on-disk store (a sparse file) under the run folder when N full
#: models of it would take more than this (smaller runs keep it in memory and in the checkpoint).
STATE_STORE_MIN_BYTES = 256 << 20


class ClientStates:
    """Per-client algorithm state (FedDyn's lambda_i), created on first use.

    With ``store_dir`` and ``num_clients`` (a run folder, and N full models of state over
    :data:`STATE_STORE_MIN_BYTES`), states live in an on-disk
    :class:`~fedbug.engine.state_store.StateStore` in ``<run>/client_states`` and the checkpoint
    holds
    only its generation; a state the store's layout does not fit stays in memory. Without, all
    states are in memory and in the checkpoint."""

    def __init__(
        self,
        algorithm: Algorithm,
        space: ParamSpace,
        store_dir: Path | None = None,
        num_clients: int | None = None,
    ) -> None:
        self.algorithm = algorithm
        self.space = space
        self.states: dict[int, dict[str, Tensor]] = {}
        self.store_dir = store_dir if num_clients is not None else None
        self.num_clients = num_clients
        self.store: StateStore | None = None

    def get(self, client: int) -> dict[str, Tensor]:
        if client in self.states:
            return self.states[client]
        stored = self.store.get(client) if self.store is not None else None
        return stored if stored is not None else self.algorithm.init_client_state(self.space)

    def put(self, client: int, state: dict[str, Tensor]) -> None:
        if not state:
            return
        # (a store folder is kept only with num_clients: __init__)
        if self.store is None and self.store_dir is not None and self.num_clients is not None:
            self.store = StateStore.create(self.store_dir, self.num_clients, state)
        if self.store is not None and self.store.accepts(state):
            self.store.put(client, state)
            self.states.pop(client, None)
        else:
            self.states[client] = state

    def close(self) -> None:
        """Close the on-disk store (its files stay for a resume); states in memory are kept."""
        if self.store is not None:
            self.store.close()
            self.store = None

    def state_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {str(k): v for k, v in sorted(self.states.items())}
        if self.store is not None:
            d["__store__"] = {"generation": self.store.commit()}
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        d = dict(d)
        stored = d.pop("__store__", None)
        self.states = {int(k): v for k, v in d.items()}
        if self.store is not None:
            self.store.close()
            self.store = None
        if stored is not None:
            if self.store_dir is None:
                raise CheckpointError("this checkpoint keeps client states in its run folder")
            layout = read_layout(self.store_dir)
            self._check_layout(layout)
            self.store = StateStore.open(self.store_dir, int(stored["generation"]), layout)

    def _check_layout(self, layout: Layout) -> None:
        """Refuse a store's layout that does not fit this run (its clients, its algorithm's
        state and local units on this model), before the store's files are opened."""
        where = str(self.store_dir / LAYOUT) if self.store_dir is not None else LAYOUT
        fix = "start the run again in another run folder (or remove this one)"
        clients, fields = layout
        if clients != self.num_clients:
            raise CheckpointError(
                f"{where!r} lays out {clients} clients where this run has {self.num_clients}; {fix}"
            )
        space = self.space
        fits = {k: tuple(v.shape) for k, v in self.algorithm.init_client_state(space).items()}
        local = self.algorithm.local_units(space.num_units)
        fits.update({f"local.{u}": (space.unit_numel[u],) for u in local})
        for name, shape in fields.items():
            if fits.get(name) != shape:
                raise CheckpointError(
                    f"{where!r}: its field {name!r} of shape {list(shape)} is not in this run's "
                    f"client state ({', '.join(f'{k} {list(v)}' for k, v in fits.items())}); "
                    f"{fix}"
                )


class LocalModelMean:
    """The mean of ALL clients' latest local models (a client never selected holds the initial
    model): what the FedBug and FedDyn authors' code plots beside the server model."""

    def __init__(self, initial: Tensor, num_clients: int) -> None:
        self.initial = initial.clone()
        self.num_clients = num_clients
        self.latest: dict[int, Tensor] = {}
        self.total = initial.double() * num_clients

    def update(self, client: int, local: Tensor) -> None:
        self.total += local.double() - self.latest.get(client, self.initial).double()
        self.latest[client] = local.clone()

    def mean(self) -> Tensor:
        return (self.total / self.num_clients).float()

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total, "latest": {str(k): v for k, v in self.latest.items()}}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.total = d["total"]
        self.latest = {int(k): v for k, v in d["latest"].items()}
