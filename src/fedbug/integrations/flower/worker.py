"""A warm ClientApp worker for a deployed SuperNode: one long-lived process runs every message.

Flower 1.41's SuperNode, in its default ``--isolation subprocess``, starts a SuperExec that
launches a fresh ``flwr-clientapp`` process for every message: the interpreter, torch and
flwr imports, then the node's client side, every time (about 4 s a message here). Started with
``--isolation process``, the SuperNode leaves that to an outside process. :func:`serve` is such
a process: it acquires the SuperNode's ClientApp tasks from its Runtime API, as SuperExec does,
and runs each in this process, as ``flwr-clientapp`` does (the same pull of the message and
context, the same reply and task output, the same error replies), so torch stays imported and
the ClientApp keeps its built client side in memory between messages.

    flower-supernode --insecure --superlink HOST:9092 --isolation process --port 9094 ...
    fedbug flower worker --runtime-api 127.0.0.1:9094 --insecure

The Runtime API is Flower's own (its HTTP client, requests and helpers); nothing here speaks a
protocol of its own. One task runs at a time, as a SuperNode hands out one message at a time.
The worker waits for its SuperNode (Flower's client retries) and outlives a restart of it; a
task the node gave up on, or a reply that cannot be returned, is logged and the next task
served. ClientApps are loaded once per app (FAB hash) and their modules stay imported: restart
the worker after installing a new version of a ClientApp of your own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from logging import ERROR, INFO, WARNING
from typing import Any

import httpx
from flwr.app import Context, Message
from flwr.app.error import Error
from flwr.cli.install import install_from_fab
from flwr.clientapp.client_app import ClientApp, LoadClientAppError
from flwr.clientapp.utils import get_load_client_app_fn
from flwr.common.constant import MAX_RETRY_DELAY, ErrorCode, SubStatus
from flwr.proto.runtime_pb2 import (  # pylint: disable=E0611
    AcquireTaskRequest,
    SendTaskHeartbeatRequest,
)
from flwr.supercore import log
from flwr.supercore.constant import TaskType
from flwr.supercore.heartbeat import HeartbeatSender
from flwr.supercore.interceptors import (
    RuntimeTokenHttpInterceptor,
    RuntimeVersionHttpInterceptor,
)
from flwr.supercore.retry import RetryInvoker, exponential
from flwr.supercore.runtime import RuntimeHttpClient
from flwr.supernode.runtime.run_clientapp import (
    pull_task_input,
    push_message,
    push_task_output,
)

from fedbug.errors import FedbugError

#: seconds between asks for a task while the node has none (SuperExec's default is 1 s)
POLL = 0.05


#: answers worth asking again: the SuperNode restarting or busy
RETRY_STATUS = frozenset({502, 503, 504})


def _retry() -> RetryInvoker:
    """Flower's HTTP retries (lost connections and 502-504, backing off up to 20 s), without
    what Flower's own retry does on a 401 (it signals its process to stop: right for a process
    a task, not for a worker that outlives its tasks). Any other answer is raised."""

    def give_up(exc: Exception) -> bool:
        if isinstance(exc, httpx.HTTPStatusError):
            return exc.response.status_code not in RETRY_STATUS
        return any(t in str(exc).lower() for t in ("certificate", "ssl", "tls"))

    return RetryInvoker(
        lambda: exponential(max_delay=MAX_RETRY_DELAY),
        (httpx.TransportError, httpx.HTTPStatusError),
        max_tries=None,
        max_time=None,
        should_giveup=give_up,
    )


def _client(
    address: str, certificates: bytes | None, retry: RetryInvoker, *interceptors: Any
) -> RuntimeHttpClient:
    return RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=certificates is None,
        root_certificates=certificates,
        interceptors=list(interceptors),
        retry_invoker=retry,
    )


def _heartbeat(client: RuntimeHttpClient, gone: threading.Event) -> Callable[[], bool]:
    """A task's heartbeat. Flower's raises SIGINT once the node says the task is over; here
    that only marks the task ``gone`` (its reply would be refused), and the worker lives on."""
    request = SendTaskHeartbeatRequest()

    def beat() -> bool:
        if gone.is_set():
            return True
        try:
            answer = client.SendTaskHeartbeat(request)
        except httpx.TransportError:
            return False  # retried by the sender
        except httpx.HTTPStatusError:
            gone.set()  # the token is gone (401): the node restarted or ended the task
            return True
        if not answer.success:
            gone.set()
        return True

    return beat


class Worker:
    """Serves one SuperNode's ClientApp tasks in this process; ClientApps are loaded once per
    app (FAB hash) and kept."""

    def __init__(self, address: str, certificates: bytes | None = None) -> None:
        self.address = address
        self.certificates = certificates
        self.apps: dict[str, ClientApp] = {}
        self.done = 0  # tasks run, for the log and the tests
        self._load: Callable[[str, str, str], ClientApp] = get_load_client_app_fn(
            default_app_ref="", app_path=None, multi_app=True
        )
        self._tasks = _client(
            address,
            certificates,
            _retry(),
            RuntimeVersionHttpInterceptor(component_name="SuperExec"),
        )

    def close(self) -> None:
        self._tasks.close()

    def acquire(self) -> str | None:
        """The token of a waiting ClientApp task, or None."""
        try:
            res = self._tasks.AcquireTask(
                AcquireTaskRequest(supported_task_types=[str(TaskType.CLIENT_APP)])
            )
        except httpx.HTTPStatusError as e:
            code = e.response.status_code
            hint = (
                "; the SuperNode asks for SuperExec authentication "
                "(--superexec-auth-secret-file), which fedbug flower worker does not do: start "
                "the SuperNode without it"
                if code in (401, 403)
                else ""
            )
            raise FedbugError(
                f"the SuperNode's Runtime API at {self.address} answered HTTP {code} when asked "
                f"for a task{hint}"
            ) from None
        return res.token if res.HasField("task") and res.token else None

    def app_for(self, run: Any, fab: Any) -> ClientApp:
        if fab.hash_str not in self.apps:
            install_from_fab(fab.content, skip_prompt=True)  # once an app, as flwr-clientapp
            self.apps[fab.hash_str] = self._load(run.fab_id, run.fab_version, fab.hash_str)
        return self.apps[fab.hash_str]

    def run_task(self, token: str) -> bool:
        """Pull the task's message and context, run the ClientApp, push the reply and the
        context back. Returns whether the ClientApp completed (a failure is replied as an
        ``Error`` message, as ``flwr-clientapp`` replies it). A task the node gave up on, or a
        node that went away, is logged; the worker goes on to the next task."""
        retry = _retry()
        client = _client(
            self.address,
            self.certificates,
            retry,
            RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"),
            RuntimeTokenHttpInterceptor(token),
        )
        gone = threading.Event()
        heartbeat = HeartbeatSender(_heartbeat(client, gone))
        message: Message | None = None
        reply: Message | None = None
        context: Context | None = None
        status, details = SubStatus.FAILED, "ClientApp task failed due to unknown reason"
        try:
            heartbeat.start()
            message, context, run, fab = pull_task_input(client)
            reply = self.app_for(run, fab)(message=message, context=context)
            status, details = SubStatus.COMPLETED, ""
        except Exception as ex:  # noqa: BLE001 - replied to the server, as flwr-clientapp does
            code = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
            reason = f"{type(ex)}:<'{ex}'>"
            if isinstance(ex, LoadClientAppError):
                code = ErrorCode.LOAD_CLIENT_APP_EXCEPTION
                reason = "An exception was raised when attempting to load `ClientApp`"
            log(ERROR, "ClientApp raised an exception", exc_info=ex)
            details = reason
            if message is not None:
                reply = Message(Error(code=code, reason=reason), reply_to=message)
        finally:
            if gone.is_set():
                log(WARNING, "fedbug worker: the node ended this task; its reply is not sent")
            elif reply is not None and context is not None:
                try:
                    push_message(client, reply, context)
                except Exception as ex:  # noqa: BLE001 - the node went away: serve the next
                    status = SubStatus.FAILED
                    log(ERROR, "fedbug worker: the task's reply could not be returned: %s", ex)
            retry.max_tries = 1  # as flwr-clientapp on its way out: try once, do not wait
            push_task_output(client, context, status, details)  # logs its own failure
            if heartbeat.is_running:
                heartbeat.stop()
            client.close()
        self.done += 1
        log(INFO, "fedbug worker: task %d %s", self.done, status)
        return status == SubStatus.COMPLETED

    def serve(self, poll: float = POLL, max_tasks: int | None = None) -> None:
        """Run tasks as they come, until stopped (or ``max_tasks`` have run)."""
        log(INFO, "fedbug worker: serving the ClientApp tasks of %s", self.address)
        while max_tasks is None or self.done < max_tasks:
            token = self.acquire()
            if token is None:
                time.sleep(poll)
                continue
            self.run_task(token)


def serve(
    address: str,
    *,
    certificates: bytes | None = None,
    poll: float = POLL,
    max_tasks: int | None = None,
) -> None:
    """Serve the ClientApp tasks of the SuperNode whose Runtime API is at ``address``
    (``HOST:PORT``, the SuperNode's ``--port``); ``certificates``: the PEM CA of a TLS Runtime
    API, None for an insecure one."""
    worker = Worker(address, certificates)
    try:
        worker.serve(poll, max_tasks)
    finally:
        worker.close()
