"""``cohort: {cuda_graphs: true}``: the vectorised gradient captured once per group shape and
replayed (fedbug.engine.executors.graphs). A CUDA graph replays the kernels it recorded on the
memory it recorded them on; here, on the CPU, a stand-in "capture" keeps the closure and
"replays" it on the same buffers, writing into the same output tensors. Whatever the captured
function read that was not one of its copied inputs (a tensor of an earlier step or round, a
number fixed at capture, the wrong key's units) gives other numbers under the stand-in, as it
would under a real graph: so every run here must equal the eager cohort executor to the bit.
The capture itself is tested on a GPU (tests/test_cuda.py)."""

from types import SimpleNamespace

import pytest
import torch
from test_cohort import UNEQUAL_EPOCH
from tiny import method_needs, tiny_config, user_data_config, without_timing
from torch.utils._pytree import tree_flatten, tree_unflatten

from fedbug.engine import run_experiment
from fedbug.engine.executors import graphs
from fedbug.engine.executors.cohort import CohortExecutor
from fedbug.engine.executors.graphs import ALIGN, GraphCache, StaticCall, aligned_like, layout
from fedbug.errors import ConfigError


def replayed_closure(fn):
    """A CPU stand-in for :func:`graphs.cuda_capture`: the first call's outputs are the
    "graph's" output tensors; each replay calls ``fn`` again on the buffers it closes over and
    writes the results into those same tensors."""
    out = fn()
    kept = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]

    def replay():
        fresh = [t for t in tree_flatten(fn())[0] if isinstance(t, torch.Tensor)]
        for o, f in zip(kept, fresh, strict=True):
            o.copy_(f)

    return replay, out


def pooled_closure(pool):
    """The stand-in with one memory pool for all its "graphs", as the executor's CUDA graphs
    share one: every capture's outputs are views at the start of the same buffer, so a replay
    overwrites what any other graph returned (the executor must read a group's gradient before
    the next group's replay)."""

    def capture(fn):
        flat, spec = tree_flatten(fn())
        if "buffer" not in pool:
            pool["buffer"] = torch.empty(1 << 22)
        views, at = [], 0
        for t in flat:
            views.append(pool["buffer"][at : at + t.numel()].view_as(t).copy_(t))
            at += t.numel()

        def replay():
            for v, f in zip(views, tree_flatten(fn())[0], strict=True):
                v.copy_(f)

        return replay, tree_unflatten(views, spec)

    return capture


@pytest.fixture
def captures(monkeypatch, request):
    """Every cohort executor built here captures with a stand-in (each graph its own outputs;
    parametrized indirectly with "pooled": all in one pool); yields the caches made."""
    pooled = getattr(request, "param", "own") == "pooled"

    def capture_for(device):
        return pooled_closure({}) if pooled else replayed_closure

    monkeypatch.setattr(graphs, "capture_for", capture_for)
    caches = []
    init = GraphCache.__init__

    def keep(self, *args, **kwargs):
        init(self, *args, **kwargs)
        caches.append(self)

    monkeypatch.setattr(GraphCache, "__init__", keep)
    return caches


def test_a_static_call_copies_its_inputs_and_returns_the_captures_outputs():
    calls = []

    def fn(a, b):
        calls.append(1)
        return {"sum": a + b}, a * b

    a, b = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    call = StaticCall(fn, [a.clone(), b.clone()], replayed_closure)
    first = call(a, b)
    assert first[0]["sum"].tolist() == [4.0, 6.0] and first[1].tolist() == [3.0, 8.0]
    again = call(torch.tensor([10.0, 20.0]), torch.tensor([1.0, 0.5]))
    assert again[0]["sum"] is first[0]["sum"]  # the same tensors, overwritten
    assert again[0]["sum"].tolist() == [11.0, 20.5] and again[1].tolist() == [10.0, 10.0]
    assert a.tolist() == [1.0, 2.0]  # the caller's inputs are copied, never written
    with pytest.raises(ValueError):
        call(a)  # one input short: refused, not replayed on a stale buffer


def fresh(*values):
    """A new tensor of ``values`` (a new allocation: 64-byte aligned on the CPU)."""
    return torch.tensor(values)


def test_a_cache_captures_a_key_at_its_second_call_and_runs_eagerly_beyond_its_limit():
    captured = []

    def counting(fn):
        captured.append(fn)
        return replayed_closure(fn)

    cache = GraphCache(counting, limit=2)
    double = lambda t: t * 2  # noqa: E731
    x = fresh(1.0, 1.0, 1.0)
    assert cache("a", double, x).tolist() == [2.0] * 3  # first call: eager, no capture
    assert not captured and not cache.calls
    assert cache("a", double, fresh(2.0, 3.0, 4.0)).tolist() == [4.0, 6.0, 8.0]  # captured
    assert cache("a", double, fresh(0.0, 1.0, 2.0)).tolist() == [0.0, 2.0, 4.0]  # replayed
    assert len(captured) == 1 and x.tolist() == [1.0] * 3
    for key in ("b", "b"):
        assert cache(key, double, x).tolist() == [2.0] * 3
    assert len(captured) == 2
    cache("a", double, x[1:])  # another shape and alignment: another graph's first call
    cache("c", double, x)  # met once: eager, no warning yet
    with pytest.warns(UserWarning, match="keeps 2 graphs"):
        assert cache("c", double, x * 5).tolist() == [10.0] * 3
    assert cache("c", double, x).tolist() == [2.0] * 3  # one warning, then silent
    assert len(captured) == 2 and cache.eager_calls == 2
    (a, b) = cache.calls.values()
    assert a.inputs[0] is b.inputs[0]  # one input buffer per layout


def test_a_wider_gradient_buffer_drops_the_graphs_that_wrote_the_narrower():
    """The gradient buffer grows only for a larger group; the graphs captured on the old one
    are dropped with it (they would go on writing there, and keep it), and captured again at
    their key's next second call."""
    cache = GraphCache(replayed_closure)
    double = lambda t: t * 2  # noqa: E731
    for _ in range(2):
        cache("a", double, fresh(1.0, 2.0))
    assert cache.calls
    flat = torch.zeros(5)
    ex = SimpleNamespace(_out=None, graphs=cache, rt=SimpleNamespace(flat=flat))
    first = CohortExecutor.out(ex, 3)
    assert first.shape == (3, 5) and not cache.calls and not cache.uses
    for _ in range(2):
        cache("a", double, fresh(1.0, 2.0))
    assert CohortExecutor.out(ex, 2).data_ptr() == first.data_ptr() and cache.calls  # narrower
    assert CohortExecutor.out(ex, 4).shape == (4, 5) and not cache.calls


def test_a_buffer_repeats_its_inputs_strides_and_alignment():
    t = torch.zeros(4, 40)[:, 3:].t()  # neither contiguous nor aligned
    b = aligned_like(t)
    assert b.shape == t.shape and b.stride() == t.stride()
    assert b.data_ptr() % ALIGN == t.data_ptr() % ALIGN == 12
    assert layout(b) == layout(t)


@pytest.mark.parametrize(
    "over",
    [
        {"momentum": 0.9, "clip_grad_norm": 1.0},
        {"policy": "bottom_up", "bottom_up": {"gu_ratio": 0.5}, "model": "digits_cnn"},
        {"algorithm": "scaffold", "momentum": 0.9},
        {"algorithm": "feddecorr", "model": "digits_cnn"},
        {"algorithm": "feddyn", "lr_decay": 0.9},
        {"optimizer": "adam", "lr": 0.01, "policy": "bottom_up", **UNEQUAL_EPOCH},
        {"algorithm": "fedbabu", "evaluation": "personalized", "finetune_epochs": 1},
        # augmented batches, each step a new batch copied into the graph's buffer
        {"augment": "crop_flip", "model": "digits_cnn", "policy": "bottom_up", **UNEQUAL_EPOCH},
        # each client's own gradient (cohort.gradient: streams), in one "graph" per group
        {"cohort": {"gradient": "streams"}, "algorithm": "feddecorr", "model": "digits_cnn"},
        {"cohort": {"gradient": "streams"}, "optimizer": "adam", "lr": 0.01, **UNEQUAL_EPOCH},
    ],
)
def test_graphed_gradients_equal_the_eager_cohort_executor_to_the_bit(captures, over):
    """Three rounds (graphs made in the first are replayed in later ones, on new weights, new
    received weights and a new learning rate), gradual unfreezing (a graph per unit set),
    unequal clients (groups that shrink as shorter rounds end), FedDecorr's term on the
    features, SCAFFOLD's and FedDyn's corrections around the gradient."""
    algorithm, policy = over.get("algorithm", "fedavg"), over.get("policy", "none")
    base = {**method_needs(algorithm, policy), "rounds": 3, "threads": 1, **over}
    cohort = base.pop("cohort", {})
    eager = run_experiment(tiny_config(executor="cohort", cohort=cohort, **base))
    assert not captures
    graphs = {**cohort, "cuda_graphs": True}
    graphed = run_experiment(tiny_config(executor="cohort", cohort=graphs, **base))
    (cache,) = captures
    assert cache.calls and not cache.eager_calls
    assert torch.equal(graphed.weights, eager.weights)
    assert without_timing(graphed.records) == without_timing(eager.records)


@pytest.mark.parametrize("captures", ["own", "pooled"], indirect=True)
def test_each_unit_set_and_group_shape_has_its_own_graph(captures):
    """Unequal clients under gradual unfreezing: graphs of several unit sets, group sizes and
    batch shapes, replayed in turn; pooled, each replay overwrites the others' outputs."""
    cfg = tiny_config(
        executor="cohort",
        cohort={"cuda_graphs": True},
        policy="bottom_up",
        bottom_up={"gu_ratio": 0.5},
        **UNEQUAL_EPOCH,
    )
    eager = run_experiment(
        cfg.model_copy(update={"cohort": cfg.cohort.model_copy(update={"cuda_graphs": False})})
    )
    graphed = run_experiment(cfg)
    assert torch.equal(graphed.weights, eager.weights)
    (cache,) = captures
    assert cache.calls and set(cache.calls) <= set(cache.uses)
    units = {units for units, _ in cache.uses}
    (w, x, _y) = zip(*(layouts for _, layouts in cache.uses))
    assert len(units) > 1  # the frozen prefix shrinks: one graph per trained set
    assert len({shape[0] for shape, *_ in w}) > 1  # fewer clients once shorter rounds end
    assert len({shape[1] for shape, *_ in x}) > 1  # a short last batch


def test_every_graph_writes_its_gradient_into_one_buffer(captures):
    """Graphs of several unit sets and group sizes (as above) return their gradients in the
    first rows of one tensor, not each in a tensor of its own (which a CUDA graph would keep in
    its pool as long as it lives: a whole gradient a unit set and shape)."""
    cfg = tiny_config(
        executor="cohort",
        cohort={"cuda_graphs": True},
        policy="bottom_up",
        bottom_up={"gu_ratio": 0.5},
        **UNEQUAL_EPOCH,
    )
    run_experiment(cfg)
    (cache,) = captures
    grads = [call.outputs[0] for call in cache.calls.values()]
    assert len({g.shape for g in grads}) > 1
    assert len({g.untyped_storage().data_ptr() for g in grads}) == 1
    assert {g.data_ptr() for g in grads} == {grads[0].untyped_storage().data_ptr()}


def test_cuda_graphs_on_a_device_without_cuda_is_one_line(tmp_path):
    with pytest.raises(
        ConfigError, match=r"^invalid config: cohort: \{cuda_graphs: true\} .* cpu has none"
    ):
        tiny_config(executor="cohort", device="cpu", cohort={"cuda_graphs": True})
    if torch.cuda.is_available():
        pytest.skip("device auto is CUDA here")
    cfg = tiny_config(executor="cohort", cohort={"cuda_graphs": True})  # auto: the CPU here
    with pytest.raises(ConfigError, match=r"device is cpu; set device: cuda on a machine"):
        run_experiment(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_channels_last_batch_keeps_its_layout_in_the_graphs_buffer(captures):
    """Three-channel images go in channels_last: the graph's batch buffer has the batch's
    strides, so it runs the eager call's convolution kernels (a contiguous copy ran others,
    1e-6 apart, which a max-pool tie or a ReLU turns into a 2% gradient)."""
    from test_cuda import random_images

    ds = random_images(n_train=48, n_test=16)
    doc = dict(
        model="standard_cnn", executor="cohort", clients_per_round=3, num_clients=6, batch_size=4,
        local_steps=None, local_epochs=1, unbalanced_sigma=0.8, count_flops=False,
    )  # fmt: skip
    cfg = user_data_config(**doc)
    eager = run_experiment(cfg, dataset=ds)
    graphed = run_experiment(user_data_config(**doc, cohort={"cuda_graphs": True}), dataset=ds)
    (cache,) = captures
    batches = [b for (_, (shape, *_)), b in cache.buffers.items() if len(shape) == 5]
    assert batches and all(b.stride()[2] == 1 for b in batches)  # channels vary fastest
    assert cache.calls and torch.equal(graphed.weights, eager.weights)


def test_a_groups_weights_have_one_layout_wherever_its_first_row_is(captures, monkeypatch):
    """Unequal clients (the tiny MLP's length is not a multiple of 16 floats): the chunk's
    rows begin on 64-byte boundaries, and scattered rows are copied in that layout, so groups
    of one size that begin at other rows than the first, or are not consecutive, share one
    weights layout (one graph, not one an alignment or a gather), aligned."""
    from fedbug.engine.executors import cohort

    starts, made = set(), cohort.Rows.of

    def spy(clients, device):
        rows = made(clients, device)
        starts.add(rows.span.start if rows.span is not None else None)
        return rows

    monkeypatch.setattr(cohort.Rows, "of", spy)
    cfg = tiny_config(
        executor="cohort", cohort={"cuda_graphs": True}, clients_per_round=6, **UNEQUAL_EPOCH
    )
    run_experiment(cfg)
    assert any(s for s in starts) and None in starts  # rows past the first; scattered rows
    (cache,) = captures
    weights = {layouts[0] for _, layouts in cache.uses}  # (shape, strides, dtype, device, align)
    assert all(w[4] == 0 and w[1][0] % (ALIGN // 4) == 0 for w in weights), weights
    assert len(weights) == len({w[0] for w in weights})  # one layout a group shape
