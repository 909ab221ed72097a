"""PFLlib (TsingZ0/PFLlib) driven on a scenario: its own server and client classes, unchanged.

For the scenario's method the harness imports ``flcore.servers.server<x>`` from the checkout's
``system/`` folder, builds ``args`` with the checkout's own command-line parser (the
``argparse`` block of ``system/main.py``, run on the flags :func:`flags` lists, e.g. ``-algo
FedRep -gr 1 -ls 2 -lbs 2 -lr 0.05 -nc 3 -pls 1 -dev cpu``), builds the model as ``main.py``
does (``FedAvgCNN(in_features=1, num_classes=10, dim=1024)``, then ``args.head = fc``,
``fc = Identity``, ``BaseHeadSplit(model, head)``), copies fedbug's initial weights into it by
parameter order (shapes checked), constructs the server (which builds its clients) and calls
``server.train()``: its whole round loop (select, send, evaluate, train, receive, aggregate;
FedBABU's fine-tuning of every client after the last round) runs as written, with
``global_rounds`` = rounds - 1 (the loop runs rounds 0..global_rounds) and ``join_ratio`` the
share of clients a round (1 in most cases).

What is replaced, each the least that lets the comparison run (RESULTS.md lists them):

1. ``torchvision`` (imported by ``main.py`` only; not imported here) and ``h5py`` (imported by
   ``serverbase.py``, used by ``save_results`` to write its accuracy file): stand-ins of
   :mod:`shims`.
2. Data: ``read_client_data`` (the name ``clientbase`` and ``serverbase`` imported from
   ``utils.data_utils``, which reads ``../dataset/<name>/train/<id>.npz``) returns the
   scenario's client data as ``process_image`` would: a list of (float32 x, int64 y) pairs.
3. Batch order: ``clientbase.DataLoader`` (the name ``load_train_data`` / ``load_test_data``
   call, with ``shuffle=True``) becomes a loader that, while a client's ``train`` or
   ``fine_tune`` runs, yields the batches of one permutation an epoch drawn from fedbug's
   generator for (seed, "client", round, client) (fine-tuning: round 0), as
   ``fedbug.engine.client.train_client`` draws them; batches are collated by torch's
   ``default_collate`` and a last partial batch is dropped (PFLlib's ``drop_last=True``). Outside
   training (the evaluation, FedROD's class count) it yields the samples in order.
4. Selection (only when fewer than all clients take part): ``server.select_clients`` draws as
   written, then the round's clients become fedbug's draw for that round.
5. Device: ``-dev cpu``; the driven code only calls ``.to(self.device)``. Files: the run happens
   in a temporary working directory (``save_results`` writes ``../results``, ``save_global_model``
   ``models/``); its printing is captured.
6. The smooth twin (``PflScenario.smooth``): the same module swap as on fedbug's side.

The weights are read by wrapping ``server.aggregate_parameters``: after it, the server's global
model and every client's model (FedROD: and its personal ``head``) as the round left them; after
``server.train()`` returns, FedBABU's clients hold their fine-tuned models.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import io
import os
import random
import sys
import tempfile
import textwrap
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from benchmarks.equivalence import shims
from benchmarks.equivalence.pfl_scenario import PFLLIB_NAME, PflScenario, build_model, client_data
from benchmarks.equivalence.scenario import smooth_twin
from fedbug.core.seeding import torch_generator

SERVER = {  # fedbug method -> (module, class) under system/flcore/servers
    "fedper": ("serverper", "FedPer"),
    "lg_fedavg": ("serverlg", "LG_FedAvg"),
    "fedrep": ("serverrep", "FedRep"),
    "fedrod": ("serverrod", "FedROD"),
    "fedbabu": ("serverbabu", "FedBABU"),
}


@dataclass
class ReferenceRun:
    flags: list[str]
    global_names: list[str] = field(default_factory=list)  # the server model's parameters
    client_names: list[str] = field(default_factory=list)  # a client's, personal head last
    rounds: list[list[torch.Tensor]] = field(default_factory=list)  # [round] global params
    clients: list[list[list[torch.Tensor]]] = field(default_factory=list)  # [round][client]
    finetuned: list[list[torch.Tensor]] = field(default_factory=list)  # [client] (FedBABU)
    batches: dict[tuple[int, int], int] = field(default_factory=dict)  # (round, client): steps
    log: str = ""


_loaded: dict[str, Any] = {}


def load(path: str | Path) -> dict[str, Any]:
    """Import the checkout's modules once (with the h5py stand-in)."""
    system = Path(path).resolve() / "system"
    if _loaded.get("path") == str(system):
        return _loaded
    if _loaded:
        raise RuntimeError("one reference checkout per process")
    if not (system / "flcore" / "servers" / "serverbase.py").is_file():
        raise SystemExit(f"{path}: not a checkout of TsingZ0/PFLlib (no system/flcore/servers)")
    shims.install_h5py()
    sys.path.insert(0, str(system))
    mods = {
        "clientbase": importlib.import_module("flcore.clients.clientbase"),
        "serverbase": importlib.import_module("flcore.servers.serverbase"),
        "models": importlib.import_module("flcore.trainmodel.models"),
    }
    for mod, _ in SERVER.values():
        mods[mod] = importlib.import_module(f"flcore.servers.{mod}")
    _loaded.update(mods, path=str(system))
    return _loaded


def flags(s: PflScenario) -> list[str]:
    """The ``main.py`` command-line flags of the scenario (every other option at its default)."""
    return [
        "-data", "equivalence", "-m", "CNN", "-algo", PFLLIB_NAME[s.method],
        "-ncl", str(s.num_classes), "-nc", str(s.clients),
        "-jr", str(s.clients_per_round / s.clients) if s.clients_per_round else "1",
        "-gr", str(s.rounds - 1), "-ls", str(s.local_epochs), "-lbs", str(s.batch_size),
        "-lr", str(s.lr), "-pls", str(s.head_epochs), "-fte", str(s.finetune_epochs),
        "-dev", "cpu",
    ] + (["-ld", "True", "-ldg", str(s.lr_decay)] if s.lr_decay != 1 else [])  # fmt: skip


def parse_args(system: Path, argv: list[str]) -> argparse.Namespace:
    """``args`` as ``system/main.py``'s own parser builds them from ``argv`` (its
    ``argparse`` block, run as written)."""
    src = (system / "main.py").read_text()
    start = src.index("parser = argparse.ArgumentParser()")
    start = src.rindex("\n", 0, start) + 1
    end = src.index("args = parser.parse_args()", start)
    ns: dict[str, Any] = {"argparse": argparse}
    exec(textwrap.dedent(src[start:end]), ns)  # noqa: S102 - the checkout's own parser
    return ns["parser"].parse_args(argv)


class _Loaders:
    """The ``DataLoader`` ``clientbase`` sees: fedbug's batch order while a client trains."""

    def __init__(self, s: PflScenario, batches: dict[tuple[int, int], int]) -> None:
        self.s = s
        self.gen: torch.Generator | None = None
        self.at = (0, 0)
        self.batches = batches  # training batches yielded per (round, client)

    def DataLoader(self, dataset, batch_size, drop_last=False, shuffle=False):  # noqa: N802
        if shuffle and self.gen is not None:
            return _ReplayLoader(dataset, batch_size, drop_last, self)
        return torch.utils.data.DataLoader(dataset, batch_size, shuffle=False, drop_last=drop_last)

    @contextlib.contextmanager
    def training(self, round: int, client: int):
        self.gen = torch_generator(self.s.seed, "client", round, client)
        self.at = (round, client)
        self.batches.setdefault(self.at, 0)
        try:
            yield
        finally:
            self.gen = None


class _ReplayLoader:
    def __init__(self, dataset, batch_size: int, drop_last: bool, loaders: _Loaders) -> None:
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.loaders = loaders

    def __iter__(self):
        n, b, gen = len(self.dataset), self.batch_size, self.loaders.gen
        perm = torch.randperm(n, generator=gen)  # one an epoch, as fedbug draws them
        stop = n - n % b if self.drop_last else n
        for start in range(0, stop, b):
            idx = perm[start : start + b].tolist()
            self.loaders.batches[self.loaders.at] += 1
            yield torch.utils.data.default_collate([self.dataset[i] for i in idx])


def _fedavg_cnn(models: Any, s: PflScenario) -> nn.Module:
    """``main.py``'s CNN for a 1- or 3-channel image data set: FedAvgCNN with ``dim`` the
    flattened conv output (1024 on 28x28, 1600 on 32x32)."""
    c, h, w = s.input_shape
    side = lambda n: ((n - 4) // 2 - 4) // 2  # noqa: E731
    return models.FedAvgCNN(in_features=c, num_classes=s.num_classes, dim=64 * side(h) * side(w))


def run(
    path: str | Path, s: PflScenario, participants: list[list[int]] | None = None
) -> ReferenceRun:
    """PFLlib's global model and every client's model after each round of the scenario;
    ``participants`` (fedbug's draw, per round) replaces PFLlib's when fewer than all clients
    take part in a round."""
    if s.rounds < 2:
        raise ValueError("PFLlib's loop needs 2 rounds at least (it averages Budget[1:])")
    m = load(path)
    system = Path(m["path"])
    out = ReferenceRun(flags=flags(s))
    args = parse_args(system, out.flags)
    data = client_data(s)

    def read_client_data(dataset, idx, is_train=True, few_shot=0):
        x, y = data[idx][0] if is_train else data[idx][1]
        return [(a, b) for a, b in zip(x, y)]  # as utils.data_utils.process_image

    loaders = _Loaders(s, out.batches)
    m["clientbase"].read_client_data = read_client_data
    m["serverbase"].read_client_data = read_client_data
    m["clientbase"].DataLoader = loaders.DataLoader

    # main.py's run(): the model, then the base/head split every method here gets
    torch.manual_seed(0)  # main.py seeds torch at import; numpy and random for selection
    np.random.seed(0)
    random.seed(0)
    args.model = _fedavg_cnn(m["models"], s).to(args.device)
    args.head = copy.deepcopy(args.model.fc)
    args.model.fc = nn.Identity()
    args.model = m["models"].BaseHeadSplit(args.model, args.head)
    if s.smooth:
        smooth_twin(args.model)
    src = list(build_model(s).parameters())
    dst = list(args.model.named_parameters())
    if len(src) != len(dst):
        raise RuntimeError(f"parameter counts differ: fedbug {len(src)}, PFLlib {len(dst)}")
    with torch.no_grad():
        for p, (name, q) in zip(src, dst):
            if p.shape != q.shape:
                raise RuntimeError(f"{name}: PFLlib {tuple(q.shape)} vs fedbug {tuple(p.shape)}")
            q.copy_(p)

    module, cls = SERVER[s.method]
    log = io.StringIO()
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "system"  # save_results writes ../results
        work.mkdir()
        os.chdir(work)
        try:
            with contextlib.redirect_stdout(log), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # as main.py does
                server = getattr(m[module], cls)(args, 0)
                _instrument(server, loaders, out, participants)
                server.train()
        finally:
            os.chdir(cwd)
    out.log = log.getvalue()
    if s.method == "fedbabu":
        out.finetuned = [_client_params(c) for c in server.clients]
    return out


def _client_params(client: Any) -> list[torch.Tensor]:
    params = [p.detach().clone() for p in client.model.parameters()]
    head = getattr(client, "head", None)  # FedROD's personal head
    if isinstance(head, nn.Module):
        params += [p.detach().clone() for p in head.parameters()]
    return params


def _instrument(
    server: Any, loaders: _Loaders, out: ReferenceRun, participants: list[list[int]] | None
) -> None:
    """Wrap (not change) what the harness needs to see: the round number (``select_clients``
    is called once at the start of a round), each client's training (the batch order), the
    weights after each aggregation; with ``participants``, the round's clients are fedbug's
    draw (PFLlib's own draw is made and set aside)."""
    counter = {"round": 0}
    select, aggregate = server.select_clients, server.aggregate_parameters

    def select_clients():
        counter["round"] += 1
        drawn = select()
        if participants is None:
            return drawn
        chosen = participants[counter["round"] - 1]
        server.current_num_join_clients = len(chosen)  # what receive_models samples from
        return [server.clients[i] for i in chosen]

    def aggregate_parameters():
        aggregate()
        out.global_names = [n for n, _ in server.global_model.named_parameters()]
        out.rounds.append([p.detach().clone() for p in server.global_model.parameters()])
        out.clients.append([_client_params(c) for c in server.clients])

    server.select_clients = select_clients
    server.aggregate_parameters = aggregate_parameters
    if [c.id for c in server.clients] != list(range(len(server.clients))):
        raise RuntimeError("PFLlib's clients are not in id order")
    for c in server.clients:
        train = c.train

        def wrapped_train(c=c, train=train):
            with loaders.training(counter["round"], c.id):
                return train()

        c.train = wrapped_train
        if hasattr(c, "fine_tune"):
            fine_tune = c.fine_tune

            def wrapped_fine_tune(*a, c=c, fine_tune=fine_tune, **k):
                with loaders.training(0, c.id):  # fedbug's FINETUNE_ROUND
                    return fine_tune(*a, **k)

            c.fine_tune = wrapped_fine_tune
    names = [f"model.{n}" for n, _ in server.clients[0].model.named_parameters()]
    head = getattr(server.clients[0], "head", None)
    if isinstance(head, nn.Module):
        names += [f"head.{n}" for n, _ in head.named_parameters()]
    out.client_names = names
