"""The Flower executor: each round's client tasks as TRAIN messages through a Flower ``Grid``.

Clients map to nodes by the partition id each node reports to a QUERY message (simulation:
every node is asked once; deployment: nodes not yet known are asked every round, since
``get_node_ids()`` lists the nodes online now). The simulation's virtual nodes are a pool
(``pooled``): they share the machine's data and the run folder's client states, so client c
goes to the node of partition c mod the number of nodes. Replies map to clients by
``reply_to_message_id`` and come back sorted by client id, whatever order they arrived in, so
the server sums them in the in-process order; each is handed on as soon as it and those of
lower client ids are in (``stream_round``), so the server aggregates while later clients still
train, and only replies that came early are held. The round's TRAIN messages share one record
of the global weights. A client whose node is unknown, whose reply is an
error or is malformed, or that misses ``flower.round_timeout``, is dropped and recorded with the
reason (a node that did not say in time which partition it holds is named in its clients'
reason); the others are aggregated. A round left with fewer than ``min_results`` updates is the
round loop's to stop or skip (``on_short_round``), as for every executor.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from torch import Tensor

from fedbug.engine.client import ClientResult, ClientTask
from fedbug.engine.executors.base import Executor
from fedbug.integrations.flower.messages import (
    ReplyError,
    decode_reply,
    encode_task,
    encode_weights,
    record_int,
)


class FlowerExecutor(Executor):
    """Runs :func:`fedbug.engine.client.train_client` on Flower nodes (see the module docstring)."""

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
        #: (nodes that did not answer the last partition query in time, nodes asked)
        self.unanswered: tuple[int, int] = (0, 0)

    # -- which node holds which client ------------------------------------------------------
    def _in_order(self, messages: list[Message], timeout: float) -> Iterator[Message | str]:
        """Push, then pull until every reply is in or ``timeout`` passes. Yields one entry a
        message, in the messages' order, as soon as it and all before it are settled: its reply,
        or why there is none. Replies that come early wait here until their turn."""
        pushed: list[str | None] = list(self.grid.push_messages(messages))
        if len(pushed) != len(messages):  # e.g. [] when the SuperLink refused a too-large push
            pushed = [None] * len(messages)
        del messages  # Flower holds what it still has to send
        waiting = {str(i) for i in pushed if i}
        replies: dict[str, Message] = {}
        end = time.monotonic() + timeout
        wait, turn, last = 0.01, 0, False
        while True:
            while turn < len(pushed) and (not pushed[turn] or str(pushed[turn]) in replies):
                mid = pushed[turn]
                turn += 1
                yield replies.pop(str(mid)) if mid else "the SuperLink did not accept the message"
            if not waiting or last:
                break
            # past the deadline (the server may have aggregated through it): one last pull
            last = time.monotonic() >= end
            if not last:
                time.sleep(min(wait, max(0.0, end - time.monotonic())))
                wait = min(1.5 * wait, self.params.poll_interval)
            for reply in self.grid.pull_messages(sorted(waiting)):
                mid = reply.metadata.reply_to_message_id
                if mid in waiting:
                    replies[mid] = reply
                    waiting.discard(mid)
                    wait = 0.01  # replies come in bursts: look again soon
        late = f"no reply within round_timeout ({self.params.round_timeout:g} s)"
        for mid in pushed[turn:]:
            yield replies.pop(str(mid), late) if mid else "the SuperLink did not accept the message"

    def _exchange(self, messages: list[Message], timeout: float) -> list[Message | str]:
        """:meth:`_in_order`, all at once."""
        return list(self._in_order(messages, timeout))

    def map_nodes(self) -> None:
        """Ask nodes not asked before which partition they hold."""
        self.unanswered = (0, 0)
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
        self.unanswered = (sum(isinstance(x, str) for x in replies), len(new))
        for node, reply in zip(new, replies, strict=True):
            if isinstance(reply, str):  # silent: asked again next round
                continue
            self.asked.add(node)
            if reply.has_error():
                continue
            pid = record_int(reply.content.config_records["node"], "partition-id")
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
    def stream_round(
        self, weights: Tensor, tasks: list[ClientTask], states: Mapping[int, dict[str, Tensor]]
    ) -> Iterator[ClientResult]:
        """Every task's TRAIN message is pushed at once; the updates come back in client id
        order, each as soon as it and those before it are in, so the server aggregates while
        later clients still train. Client states stay on the nodes (``states`` is not read)."""
        self.dropped = []
        self.map_nodes()
        exp = self.exp
        sendable = self.assign(tasks)
        if not sendable:
            return
        shared = encode_weights(weights, exp.space)  # one copy for all the round's messages
        msgs = [
            Message(
                encode_task(
                    shared, t, has_state=t.client in self.has_state, threads=exp.cfg.threads
                ),
                node,
                MessageType.TRAIN,
                group_id=str(t.round),
                ttl=self.params.round_timeout,
            )
            for t, node in sendable
        ]
        del shared
        replies = self._in_order(msgs, self.params.round_timeout)
        del msgs
        for (t, _node), reply in zip(sendable, replies, strict=True):
            result = self._read(reply, t.client)
            del reply
            if isinstance(result, str):
                self.dropped.append({"client": t.client, "reason": result})
            else:
                yield result

    def assign(self, tasks: list[ClientTask]) -> list[tuple[ClientTask, int]]:
        """(task, node) for each task in client order whose client a node can train; the others
        go to :attr:`dropped` with the reason."""
        sendable: list[tuple[ClientTask, int]] = []
        for t in sorted(tasks, key=lambda t: t.client):
            node = self.node_for(t.client)
            if node is not None:
                sendable.append((t, node))
            else:
                self.dropped.append({"client": t.client, "reason": self.nodeless()})
        return sendable

    def nodeless(self) -> str:
        """Why a client has no node."""
        nodeless = "no SuperNode holds this partition"
        silent, asked = self.unanswered
        if silent:  # the likely cause: the nodes that hold it did not say so in time
            nodeless += (
                f" ({silent} of {asked} SuperNodes did not say which partition they hold within "
                f"round_timeout ({self.params.round_timeout:g} s))"
            )
        return nodeless

    def _read(self, reply: Message | str, client: int) -> ClientResult | str:
        """The client's update, or why it has none."""
        if isinstance(reply, str):
            return reply
        if reply.has_error():
            err = reply.error
            # (Flower reads an empty reason back as None)
            return f"error reply (code {err.code}): {_one_line(err.reason or '')}"
        try:
            result = decode_reply(reply.content, self.exp.space, client)
        except ReplyError as e:
            return f"malformed reply: {e}"
        if self.exp.keeps_client_state:
            self.has_state.add(client)
        return result

    def lost(self) -> list[dict[str, Any]]:
        return list(self.dropped)

    def required(self, selected: int, min_results: int) -> int:
        return self.params.required(selected, min_results)


def _one_line(text: Iterable[str] | str) -> str:
    s = text if isinstance(text, str) else " ".join(text)
    lines = [x for x in s.strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else "no reason given"
