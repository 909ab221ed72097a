"""``flower.secagg``: each round's updates summed by Flower's own SecAgg+ (``SecAggPlusWorkflow``
on the server, ``secaggplus_mod`` on the nodes); the server sees the sum only.

:class:`SecAggExecutor` runs one SecAgg+ session a round over the round's clients, each on its
own node: setup and key sharing (SecAgg+'s stages 0 and 1), then each node receives fedbug's TRAIN
content with its key shares, trains, and answers with its masked vector (stage 2), then the
survivors' key shares unmask the sum (stage 3). The workflow is Flower's, unchanged but for one
hook (:class:`_Workflow`: the TRAIN content of each node replaces the legacy ``FitIns``); the
legacy ``Strategy`` it calls only takes the unmasked sum back (:class:`_TakeSum`). From the sum,
:class:`~fedbug.integrations.flower.secagg_vector.SecureAggregate` holds every per-unit sum,
weight and count the round loop's aggregate keeps, so the algorithms' server steps run unchanged.

What the server sees: the sum of the clients' vectors (within the quantisation error,
:meth:`~fedbug.integrations.flower.secagg_params.SecAggParams.sum_bound`), and per client the
clear fields (:data:`~fedbug.integrations.flower.secagg_client.CLEAR`: sample count, costs, the
units trained and sent: the simulated system times each client from them). Where a policy's
choice of units depends on the data (FreezeFL's n* from Eq. 2's importances), these reveal that
choice, not any value. Not seen: any client's delta, extra tensors, train loss (each client's
result carries the round's mean, from the sum), ``info`` (FreezeFL's importances) and ``figures``
(empty). Flower 1.41 expands SecAgg+'s masks from 32-bit seeds with NumPy's Mersenne Twister
(flwrlabs/flower#7522): its confidentiality is that of Flower's implementation.

Clients that fail or time out at any stage are dropped, and recorded; SecAgg+ unmasks the sum of
those who sent their masked vector while at least ``reconstruction_threshold`` of each one's
neighbours answer the last stage; otherwise the round has no updates (a short round).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.common import FitIns, FitRes, Parameters, parameters_to_ndarrays
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import WorkflowState
from flwr.serverapp import Grid
from torch import Tensor

from fedbug.engine.aggregate import Aggregate
from fedbug.engine.client import ClientResult, ClientTask
from fedbug.integrations.flower.executor import FlowerExecutor
from fedbug.integrations.flower.messages import encode_task, encode_weights
from fedbug.integrations.flower.secagg_client import META
from fedbug.integrations.flower.secagg_vector import Layout, SecureAggregate, from_grid


class _Workflow(SecAggPlusWorkflow):
    """Flower's SecAgg+ workflow; after its setup stage, each node's stage-2 content is fedbug's
    TRAIN content for its client (``contents``) instead of a legacy ``FitIns``."""

    def __init__(self, contents: dict[int, RecordDict], **options: Any) -> None:
        super().__init__(**options)
        self.contents = contents
        self.state: WorkflowState | None = None  # the session's, for the nodes' errors

    def setup_stage(self, grid: Grid, context: LegacyContext, state: WorkflowState) -> bool:
        self.state = state
        ok = super().setup_stage(grid, context, state)
        state.nid_to_fitins = {nid: self.contents[nid] for nid in state.nid_to_fitins}
        return ok


class _TakeSum(Strategy):
    """The legacy strategy SecAgg+ calls: picks the round's nodes, and takes the unmasked sum
    (the same aggregated parameters in every result) with the results' clear metrics."""

    def __init__(self, proxies: list[ClientProxy]) -> None:
        self.proxies = proxies
        self.results: list[tuple[ClientProxy, FitRes]] | None = None

    def initialize_parameters(self, client_manager: Any) -> Parameters | None:
        return None

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: Any
    ) -> list[tuple[ClientProxy, FitIns]]:
        return [(p, FitIns(Parameters([], ""), {})) for p in self.proxies]

    def aggregate_fit(
        self, server_round: int, results: list[tuple[ClientProxy, FitRes]], failures: Any
    ) -> tuple[Parameters | None, dict[str, Any]]:
        self.results = list(results)
        return None, {}  # the round loop, not the workflow, updates the model

    def configure_evaluate(self, server_round: int, parameters: Any, client_manager: Any) -> list:
        return []

    def aggregate_evaluate(self, server_round: int, results: Any, failures: Any) -> tuple:
        return None, {}

    def evaluate(self, server_round: int, parameters: Any) -> None:
        return None


class SecAggExecutor(FlowerExecutor):
    """A :class:`FlowerExecutor` whose rounds are summed by SecAgg+ (see the module docstring)."""

    def __init__(self, grid: Grid, exp: Any, *, map_once: bool, pooled: bool = False) -> None:
        super().__init__(grid, exp, map_once=map_once, pooled=pooled)
        self.secagg = exp.cfg.flower.secagg
        self.agg: SecureAggregate | None = None
        self._zeros = torch.zeros(exp.space.total)

    def round_aggregate(self) -> Aggregate:
        self.agg = SecureAggregate(self.exp.space, self.exp.cfg.weighting)
        return self.agg

    def assign(self, tasks: list[ClientTask]) -> list[tuple[ClientTask, int]]:
        """As the plain executor, but in a pool (the simulation) a round's i-th client goes to
        its i-th node: SecAgg+ runs one client a node."""
        if not self.pooled:
            return super().assign(tasks)
        nodes = [self.node_of[p] for p in sorted(self.node_of)]
        out: list[tuple[ClientTask, int]] = []
        for i, t in enumerate(sorted(tasks, key=lambda t: t.client)):
            if i < len(nodes):
                out.append((t, nodes[i]))
            else:
                why = self.nodeless() if not nodes else "no free SuperNode (SecAgg+: one a client)"
                self.dropped.append({"client": t.client, "reason": why})
        return out

    def stream_round(
        self, weights: Tensor, tasks: list[ClientTask], states: Mapping[int, dict[str, Tensor]]
    ) -> Iterator[ClientResult]:
        """The round's clients train on their nodes inside one SecAgg+ session; once it has
        unmasked the sum, each client that took part comes back as a result without its update
        (the sums are in the round's :class:`SecureAggregate`), in client order."""
        agg, self.agg = self.agg, None
        if agg is None:
            raise RuntimeError("flower.secagg: round_aggregate() must come before stream_round()")
        self.dropped = []
        self.map_nodes()
        sendable = self.assign(tasks)
        if not sendable:
            return
        shared = encode_weights(weights, self.exp.space)
        threads = self.exp.cfg.threads
        contents = {
            node: encode_task(shared, t, has_state=t.client in self.has_state, threads=threads)
            for t, node in sendable
        }
        del shared
        results, why = self.run_protocol(sendable[0][0].round, contents)
        got = {int(proxy.node_id): fitres for proxy, fitres in results}
        for t, node in sendable:
            if node not in got:
                self.dropped.append({"client": t.client, "reason": why})
        yield from self.unmasked(agg, [(t, got[n]) for t, n in sendable if n in got])

    def run_protocol(
        self, round: int, contents: dict[int, RecordDict]
    ) -> tuple[list[tuple[ClientProxy, FitRes]], str]:
        """One SecAgg+ session over ``contents``' nodes: the results whose masked vectors are in
        the unmasked sum, and why the others are not."""
        sa = self.secagg
        proxies: list[ClientProxy] = [GridClientProxy(n, self.grid, 0) for n in contents]
        strategy = _TakeSum(proxies)
        base = Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={})
        context = LegacyContext(base, strategy=strategy)
        context.state[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: round})
        context.state[MAIN_PARAMS_RECORD] = ArrayRecord()
        timeout = sa.timeout if sa.timeout is not None else self.params.round_timeout
        workflow = _Workflow(
            contents,
            num_shares=sa.num_shares,
            reconstruction_threshold=sa.reconstruction_threshold,
            max_weight=1.0,  # each client's weight 1: fedbug weighs inside the vector
            clipping_range=sa.clipping_range,
            quantization_range=sa.quantization_range,
            modulus_range=sa.modulus_range,
            timeout=timeout,
        )
        try:
            workflow(self.grid, context)
        except Exception as e:  # noqa: BLE001  (any failure of the protocol loses the round)
            return [], f"secure aggregation failed: {type(e).__name__}: {_line(str(e))}"
        failures = workflow.state.failures if workflow.state is not None else []
        said = f" (a node's error: {_error(failures[0])})" if failures else ""
        if strategy.results is None:
            return [], (
                f"secure aggregation halted{said}: too few clients answered a SecAgg+ stage "
                f"within {timeout:g} s (it needs 2, and reconstruction_threshold of each one's "
                "neighbours)"
            )
        return strategy.results, f"no masked vector in the secure sum{said or ' (timed out)'}"

    def unmasked(
        self, agg: SecureAggregate, taken: list[tuple[ClientTask, FitRes]]
    ) -> Iterator[ClientResult]:
        """Set ``agg`` from the unmasked sum; each client's result, without its update."""
        if not taken:
            return
        clear = [json.loads(str(fitres.metrics[META])) for _, fitres in taken]
        layouts = {json.dumps(c["extras"]) for c in clear}
        if len(layouts) > 1:
            for t, _ in taken:
                why = "clients sent extra tensors of different keys or shapes; SecAgg+ sums one"
                self.dropped.append({"client": t.client, "reason": why})
            return
        # the workflow's parameters: the sum over the n results divided by n (each weight 1)
        (mean,) = parameters_to_ndarrays(taken[0][1].parameters)
        extras = tuple((k, tuple(shape)) for k, shape in clear[0]["extras"])
        finite = sum(1 for c in clear if not c["non-finite"])
        n = len(taken)
        self.set_sum(agg, np.asarray(mean, dtype=np.float64) * n, n, extras, finite)
        for (t, _), c in zip(taken, clear, strict=True):
            if self.exp.keeps_client_state:
                self.has_state.add(t.client)
            yield self.light_result(t.client, c, agg.mean_loss)

    def set_sum(
        self, agg: SecureAggregate, total: np.ndarray, n: int, extras: tuple, finite: int
    ) -> None:
        """Set ``agg`` from the round's unmasked sum ``total`` over ``n`` clients (``finite`` of
        them with finite results); warn where SecAgg+ clipped values."""
        sa, space = self.secagg, self.exp.space
        weighted = self.exp.cfg.weighting == "samples"
        c, q = sa.clipping_range, sa.quantization_range
        layout = Layout(space, weighted, sa.max_weight, extras, c, q)
        bound = sa.sum_bound(n)
        agg.set_sum(layout, from_grid(total, q) if sa.residual else total, finite, bound)
        if agg.clipped > 0.5 + bound * layout.size() / c:
            warnings.warn(
                f"flower.secagg: about {agg.clipped:.0f} of the round's {n} x {layout.size()} "
                f"values exceeded clipping_range ({c:g}) and were clipped, so the sum is off by "
                "more than the quantisation bound; raise flower.secagg.clipping_range",
                stacklevel=3,
            )

    def light_result(self, client: int, clear: dict[str, Any], loss: float | None) -> ClientResult:
        """A client's result as the server sees it: its clear fields; the round's mean loss; a
        zero delta (its update is only in the sum), nan where it said its own was not finite
        (so the round loop drops it or stops, as ``on_divergence`` says)."""
        delta = self._zeros if not clear["non-finite"] else torch.full_like(self._zeros, np.nan)
        if int(clear["client"]) != client:
            delta = torch.empty(0)  # malformed: screened out by the round loop
        return ClientResult(
            client=client,
            num_samples=int(clear["num-samples"]),
            delta=delta,
            trained=[bool(x) for x in clear["trained"]],
            state={},
            uploaded=[bool(x) for x in clear["uploaded"]],
            train_loss=loss if loss is not None else 0.0,
            **clear["fields"],
        )

    def close(self) -> None:
        self.agg = None
        super().close()


def _error(failure: BaseException) -> str:
    """A node's error reply (SecAgg+ keeps ``Exception(Error)``) as one line."""
    err = failure.args[0] if failure.args else failure
    return _line(str(getattr(err, "reason", err)))


def _line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:300] if lines else "no reason given"
