"""The Flower executor: each round's client tasks as TRAIN messages through a Flower ``Grid``.

Clients map to nodes by the partition id each node reports to a QUERY message (simulation:
every node is asked once; deployment: nodes not yet known are asked every round, since
``get_node_ids()`` lists the nodes online now). The simulation's virtual nodes are a pool
(``pooled``): they share the machine's data and the run folder's client states, so client c
goes to the node of partition c mod the number of nodes. Replies map to clients by
``reply_to_message_id`` and come back sorted by client id, whatever order they arrived in, so
the server sums them in the in-process order. A client whose node is unknown, whose reply is an
error or is malformed, or that misses ``flower.round_timeout``, is dropped and recorded with the
reason; the others are aggregated.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from torch import Tensor

from fedbug.client import ClientResult, ClientTask
from fedbug.engine.executors.base import Executor
from fedbug.flower.messages import ReplyError, decode_reply, encode_task


class FlowerExecutor(Executor):
    """Runs :func:`fedbug.client.train_client` on Flower nodes (see the module docstring)."""

    def __init__(self, grid: Grid, exp: Any, *, map_once: bool, pooled: bool = False) -> None:
        self.grid = grid
        self.exp = exp
        self.params = exp.cfg.flower
        self.map_once = map_once
        self.pooled = pooled
        self.node_of: dict[int, int] = {}
        self.asked: set[int] = set()
        self.has_state: set[int] = set()
        self.dropped: list[dict[str, Any]] = []

    # -- which node holds which client ------------------------------------------------------
    def _exchange(self, messages: list[Message], timeout: float) -> list[Message | str]:
        """Push, then pull until every reply is in or ``timeout`` passes. One entry a message,
        in order: its reply, or why there is none."""
        pushed = list(self.grid.push_messages(messages))
        if len(pushed) != len(messages):  # e.g. [] when the SuperLink refused a too-large push
            pushed = [None] * len(messages)
        waiting = {str(i) for i in pushed if i}
        replies: dict[str, Message] = {}
        end = time.monotonic() + timeout
        wait = 0.01
        while waiting:
            for reply in self.grid.pull_messages(sorted(waiting)):
                mid = reply.metadata.reply_to_message_id
                if mid in waiting:
                    replies[mid] = reply
                    waiting.discard(mid)
            if not waiting or time.monotonic() >= end:
                break
            time.sleep(min(wait, max(0.0, end - time.monotonic())))
            wait = min(1.5 * wait, self.params.poll_interval)
        late = f"no reply within round_timeout ({self.params.round_timeout:g} s)"
        return [
            replies.get(str(i), late) if i else "the SuperLink did not accept the message"
            for i in pushed
        ]

    def map_nodes(self) -> None:
        """Ask nodes not asked before which partition they hold."""
        if self.map_once and self.asked:
            return
        new = [n for n in self.grid.get_node_ids() if n not in self.asked]
        if not new:
            return
        msgs = [
            Message(
                RecordDict({"ask": ConfigRecord({"what": "partition-id"})}), n, MessageType.QUERY
            )
            for n in new
        ]
        replies = self._exchange(msgs, self.params.round_timeout)
        for node, reply in zip(new, replies, strict=True):
            if isinstance(reply, str):  # silent: asked again next round
                continue
            self.asked.add(node)
            if reply.has_error():
                continue
            pid = int(reply.content.config_records["node"]["partition-id"])
            if 0 <= pid < self.exp.num_clients:
                self.node_of[pid] = node

    def node_for(self, client: int) -> int | None:
        """The node that trains ``client``: the one holding its partition; in a pool (the
        simulation's nodes, which share the data and the disk) client c goes to the node of
        partition c mod the pool's size. None: no node can."""
        if client in self.node_of:
            return self.node_of[client]
        if self.pooled and self.node_of:
            pids = sorted(self.node_of)
            return self.node_of[pids[client % len(pids)]]
        return None

    # -- one round -------------------------------------------------------------------------
    def run_round(
        self, weights: Tensor, tasks: list[ClientTask], states: dict[int, dict[str, Tensor]]
    ) -> list[ClientResult]:
        self.dropped = []
        self.map_nodes()
        exp = self.exp
        sendable: list[tuple[ClientTask, int]] = []
        for t in sorted(tasks, key=lambda t: t.client):
            node = self.node_for(t.client)
            if node is not None:
                sendable.append((t, node))
            else:
                self.dropped.append(
                    {"client": t.client, "reason": "no SuperNode holds this partition"}
                )
        msgs = [
            Message(
                encode_task(
                    weights,
                    t,
                    exp.space,
                    has_state=t.client in self.has_state,
                    threads=exp.cfg.threads,
                ),
                node,
                MessageType.TRAIN,
                group_id=str(t.round),
                ttl=self.params.round_timeout,
            )
            for t, node in sendable
        ]
        replies = self._exchange(msgs, self.params.round_timeout) if msgs else []
        results: list[ClientResult] = []
        for (t, _node), reply in zip(sendable, replies, strict=True):
            reason = self._read(reply, t.client, results)
            if reason is not None:
                self.dropped.append({"client": t.client, "reason": reason})
        results.sort(key=lambda r: r.client)
        return results

    def _read(self, reply: Message | str, client: int, out: list[ClientResult]) -> str | None:
        if isinstance(reply, str):
            return reply
        if reply.has_error():
            err = reply.error
            return f"error reply (code {err.code}): {_one_line(err.reason)}"
        try:
            result = decode_reply(reply.content, self.exp.space, client)
        except ReplyError as e:
            return f"malformed reply: {e}"
        if self.exp.keeps_client_state:
            self.has_state.add(client)
        out.append(result)
        return None

    def lost(self) -> list[dict[str, Any]]:
        return list(self.dropped)

    def required(self, selected: int, min_results: int) -> int:
        return self.params.required(selected, min_results)


def _one_line(text: Iterable[str] | str) -> str:
    s = text if isinstance(text, str) else " ".join(text)
    lines = [x for x in s.strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else "no reason given"
