"""``cohort: {cuda_graphs: true}``: the vectorised gradient captured once per group shape and
replayed (fedbug.engine.executors.graphs). A CUDA graph replays the kernels it recorded on the
memory it recorded them on; here, on the CPU, a stand-in "capture" keeps the closure and
"replays" it on the same buffers, writing into the same output tensors. Whatever the captured
function read that was not one of its copied inputs (a tensor of an earlier step or round, a
number fixed at capture, the wrong key's units) gives other numbers under the stand-in, as it
would under a real graph: so every run here must equal the eager cohort executor to the bit.
The capture itself is tested on a GPU (tests/test_cuda.py)."""

import pytest
import torch
from test_cohort import UNEQUAL_EPOCH
from tiny import method_needs, tiny_config, without_timing
from torch.utils._pytree import tree_flatten

from fedbug.engine import run_experiment
from fedbug.engine.executors import graphs
from fedbug.engine.executors.graphs import GraphCache, StaticCall
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


@pytest.fixture
def captures(monkeypatch):
    """Every cohort executor built here captures with the stand-in; yields the caches made."""
    made = []

    def capture_for(device):
        made.append(device)
        return replayed_closure

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
    call = StaticCall(fn, [a, b], replayed_closure)
    first = call(a, b)
    assert first[0]["sum"].tolist() == [4.0, 6.0] and first[1].tolist() == [3.0, 8.0]
    again = call(torch.tensor([10.0, 20.0]), torch.tensor([1.0, 0.5]))
    assert again[0]["sum"] is first[0]["sum"]  # the same tensors, overwritten
    assert again[0]["sum"].tolist() == [11.0, 20.5] and again[1].tolist() == [10.0, 10.0]
    assert a.tolist() == [1.0, 2.0]  # the caller's inputs are copied, never written
    with pytest.raises(ValueError):
        call(a)  # one input short: refused, not replayed on a stale buffer


def test_a_cache_captures_once_per_key_and_runs_eagerly_beyond_its_limit():
    captured = []

    def counting(fn):
        captured.append(fn)
        return replayed_closure(fn)

    cache = GraphCache(counting, limit=2)
    double = lambda t: t * 2  # noqa: E731
    x = torch.ones(3)
    assert cache("a", double, x).tolist() == [2.0] * 3
    assert cache("a", double, x + 1).tolist() == [4.0] * 3
    assert cache("b", double, x).tolist() == [2.0] * 3
    assert len(captured) == 2
    with pytest.warns(UserWarning, match="keeps 2 graphs"):
        assert cache("c", double, x * 5).tolist() == [10.0] * 3
    assert cache("d", double, x).tolist() == [2.0] * 3  # one warning, then silent
    assert len(captured) == 2 and cache.eager_calls == 2


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
    ],
)
def test_graphed_gradients_equal_the_eager_cohort_executor_to_the_bit(captures, over):
    """Three rounds (graphs made in the first are replayed in later ones, on new weights, new
    received weights and a new learning rate), gradual unfreezing (a graph per unit set),
    unequal clients (groups that shrink as shorter rounds end), FedDecorr's term on the
    features, SCAFFOLD's and FedDyn's corrections around the gradient."""
    algorithm, policy = over.get("algorithm", "fedavg"), over.get("policy", "none")
    base = {**method_needs(algorithm, policy), "rounds": 3, "threads": 1, **over}
    eager = run_experiment(tiny_config(executor="cohort", **base))
    assert not captures
    graphed = run_experiment(tiny_config(executor="cohort", cohort={"cuda_graphs": True}, **base))
    (cache,) = captures
    assert cache.calls and not cache.eager_calls
    assert torch.equal(graphed.weights, eager.weights)
    assert without_timing(graphed.records) == without_timing(eager.records)


def test_each_unit_set_and_group_shape_has_its_own_graph(captures):
    cfg = tiny_config(
        executor="cohort",
        cohort={"cuda_graphs": True},
        policy="bottom_up",
        bottom_up={"gu_ratio": 0.5},
        **UNEQUAL_EPOCH,
    )
    run_experiment(cfg)
    (cache,) = captures
    units = {key[0] for key in cache.calls}
    shapes = {key[1:4] for key in cache.calls}
    assert len(units) > 1  # the frozen prefix shrinks: one graph per trained set
    assert len({s[0][0] for s in shapes}) > 1  # fewer clients once shorter rounds end
    assert len({s[1][1] for s in shapes}) > 1  # a short last batch


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
