"""A Flower ``Grid`` in this process: every message is serialised to protobuf and back (as on
the wire), handed to the ClientApp with its node's own ``Context``, and the reply serialised
back. Nodes keep their ``context.state`` between messages, as a SuperNode does."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from fedbug.integrations.flower.launch import processes_with_env  # noqa: F401  (for the tests)
from fedbug.integrations.flower.loopback import Deployment  # noqa: F401  (for the tests)

SERVER_NODE = 1


@contextlib.contextmanager
def task_identity(run_id: int = 7, node_id: int = SERVER_NODE) -> Iterator[None]:
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, node_id, 1
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def _wire(msg: Message) -> Message:
    return message_from_proto(message_to_proto(msg))


class LoopbackGrid(Grid):
    """Nodes 100.. hold partitions 0..N-1 (``partition-id`` in their node config)."""

    def __init__(
        self,
        app: Any,
        num_nodes: int,
        run_config: dict[str, Any],
        *,
        node_ids: list[int] | None = None,
        silent: set[int] = frozenset(),  # type: ignore[assignment]
        reverse: bool = False,
    ) -> None:
        self.app = app
        ids = node_ids or [100 + i for i in range(num_nodes)]
        self.contexts = {
            nid: Context(
                run_id=7,
                node_id=nid,
                node_config={"partition-id": i, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i, nid in enumerate(ids)
        }
        self.silent = set(silent)  # nodes that answer the query, then never a TRAIN message
        self.reverse = reverse  # replies come back in reverse order
        self.replies: dict[str, Message] = {}
        self.counter = 0
        self.sent: list[Message] = []

    def set_run(self, run: Any) -> None:  # pragma: no cover - not used
        pass

    @property
    def run(self) -> Any:  # pragma: no cover - not used
        return None

    def create_message(self, *a: Any, **k: Any) -> Message:  # pragma: no cover
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            self.counter += 1
            mid = f"m{self.counter}"
            msg.metadata.__dict__["_message_id"] = mid
            wired = _wire(msg)
            self.sent.append(wired)
            ids.append(mid)
            node = msg.metadata.dst_node_id
            if node in self.silent and msg.metadata.message_type == "train":
                continue
            ctx = self.contexts[node]
            with task_identity(node_id=node):
                try:
                    reply = self.app(wired, ctx)
                except Exception as e:  # as a SuperNode: an error reply
                    reply = Message(
                        Error(code=3, reason=f"{type(e).__name__}: {e}"), reply_to=wired
                    )
            self.replies[mid] = _wire(reply)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        out = [self.replies.pop(i) for i in list(message_ids) if i in self.replies]
        return list(reversed(out)) if self.reverse else out

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:  # pragma: no cover - the executor pushes and pulls itself
        return self.pull_messages(self.push_messages(messages))


def run_records(run_dir: Any) -> list[dict]:
    """A run folder's metrics.jsonl records without their timings."""
    import json

    from tiny import without_timing

    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return without_timing(json.loads(x) for x in lines)


def only_run(out: Any) -> Any:
    """The one run folder under ``out``."""
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir
