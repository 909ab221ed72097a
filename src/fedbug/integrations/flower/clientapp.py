"""The Flower ClientApp: one TRAIN message -> :func:`fedbug.engine.client.train_client` -> a reply.

Each node builds the experiment from the run config once per process (data set, partition,
model; the same seeded partition the server computes) and trains the client it is asked for.
Per-client algorithm state (FedDyn's lambda_i, personal parts) lives on the node, never on the
server: in the node's ``context.state``, or, where the run config names ``node-state-dir`` (the
simulation fedbug starts: the run folder's ``.flower/node-states``), on disk in versions by
round (:class:`~fedbug.integrations.flower.node_state.NodeStates`), so a resumed run goes on
exactly. A client
whose state the server expects but the node lacks (a restarted SuperNode) starts from the
initial state and reports ``state_reset``.
"""

from __future__ import annotations

import json
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedbug.core.user_modules import import_from_env
from fedbug.engine.client import train_client
from fedbug.integrations.flower.messages import (
    decode_task,
    encode_reply,
    record_int,
    sent_units,
)
from fedbug.integrations.flower.node_cache import cache_dir, entry_path, load_or_build
from fedbug.integrations.flower.node_state import NodeStates
from fedbug.integrations.flower.secagg_client import is_secure, secagg_mod, secure_reply

app = ClientApp()

STATE = "fedbug-state"
STATE_INFO = "fedbug-state-info"

_CACHE: dict[tuple[str, str, str], Any] = {}


def experiment_for(run_config: dict[str, Any], node_config: dict[str, Any]) -> Any:
    """(experiment, runtime) for this run's config, built once per process, or loaded from the
    node's cache (:mod:`fedbug.integrations.flower.node_cache`) where an earlier process built
    it."""
    text = str(run_config["config"])
    data_dir = str(node_config.get("data-dir", "") or run_config.get("data-dir", ""))
    device = str(node_config.get("device", "") or "")  # this node's own (a GPU host's cuda:1)
    key = (text, data_dir, device)
    if key not in _CACHE:
        # the node's own modules (--import where fedbug started it, or the node's FEDBUG_IMPORT):
        # the config may name their methods, and a cached client side refers to them
        import_from_env()

        def build() -> Any:
            from fedbug.config import load_config
            from fedbug.engine.experiment import ClientSide

            doc = json.loads(text)
            if data_dir:
                doc["data_dir"] = data_dir
            if device:
                doc["device"] = device
            return ClientSide(load_config(None, doc=doc))

        # a deployed node starts a process a message: the built client side from its disk
        folder = cache_dir(node_config)
        exp = load_or_build(entry_path(folder, key) if folder else None, build)
        _CACHE.clear()  # one run's experiment a process
        _CACHE[key] = (exp, exp.make_runtime())
    return _CACHE[key]


def _partition(context: Context) -> tuple[int | None, int | None]:
    nc = context.node_config
    pid, num = nc.get("partition-id"), nc.get("num-partitions")
    return (int(pid) if pid is not None else None, int(num) if num is not None else None)


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the server which client (partition) this node holds."""
    pid, num = _partition(context)
    if pid is None:
        raise ValueError(
            "this SuperNode has no partition-id; start it with "
            '--node-config "partition-id=I num-partitions=N"'
        )
    record = ConfigRecord({"partition-id": pid, "num-partitions": num if num is not None else -1})
    return Message(RecordDict({"node": record}), reply_to=msg)


def _on_disk(context: Context, exp: Any) -> NodeStates | None:
    root = str(context.run_config.get("node-state-dir", "") or "")
    return NodeStates(root, exp.cfg.checkpoint_every) if root else None


def _load_state(
    context: Context, exp: Any, client: int, round: int
) -> dict[str, torch.Tensor] | None:
    disk = _on_disk(context, exp)
    if disk is not None:
        return disk.load(client, round)
    info = context.state.config_records.get(STATE_INFO)
    if info is None or record_int(info, "client") != client:
        return None
    return context.state.array_records[STATE].to_torch_state_dict()


def _save_state(
    context: Context, exp: Any, client: int, round: int, state: dict[str, torch.Tensor]
) -> None:
    disk = _on_disk(context, exp)
    if disk is not None:
        disk.save(client, round, state)
        return
    context.state[STATE] = ArrayRecord({k: v.detach().contiguous() for k, v in state.items()})
    context.state[STATE_INFO] = ConfigRecord({"client": client})


@app.train(mods=[secagg_mod])  # Flower's SecAgg+ on the messages of its protocol only
def train(msg: Message, context: Context) -> Message:
    """Train the client the message names from the weights it carries; reply with its update."""
    exp, runtime = experiment_for(context.run_config, context.node_config)
    weights, task, tcfg = decode_task(msg.content, exp.space)
    torch.set_num_threads(int(tcfg["threads"]))
    pid, _ = _partition(context)
    pooled = bool(context.run_config.get("pooled-nodes", False))  # any node, any client
    if pid is not None and pid != task.client and not pooled:
        raise ValueError(f"this SuperNode holds partition {pid}, not client {task.client}")
    # on disk, versions by round are right after a resume too (the server's has-state is not)
    wanted = tcfg["has-state"] or _on_disk(context, exp) is not None
    stored = _load_state(context, exp, task.client, task.round) if wanted else None
    state = stored if stored is not None else exp.algorithm.init_client_state(exp.space)
    result = train_client(weights, task, exp.client_data(task.client), state, runtime)
    if tcfg["has-state"] and stored is None:
        result.state_reset = True
    if result.state:
        _save_state(context, exp, task.client, task.round, result.state)
    sent = sent_units(result)
    if is_secure(msg):  # flower.secagg: the reply secaggplus_mod masks
        return Message(secure_reply(result, exp, task, sent), reply_to=msg)
    return Message(encode_reply(result, exp.space, sent), reply_to=msg)
