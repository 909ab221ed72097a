"""The speed levers change no number that matters: fedbug's round equals a bare PyTorch loop,
channels_last equals contiguous within float32 rounding, and a frozen unit's weight-gradient
kernel does not run."""

import torch
import torch.nn.functional as F
from tiny import tiny_config

from fedbug.core.seeding import torch_generator
from fedbug.engine import Experiment, run_experiment
from fedbug.engine.client import ClientTask, train_client
from fedbug.engine.states import ClientStates
from fedbug.models import build_model

CNN = {"model": "digits_cnn", "weight_decay": 1e-3, "count_flops": False, "threads": 1}


def test_bare_loop_equals_sequential_executor_after_one_round():
    """Plain PyTorch (load_state_dict, SGD with weight decay, zero_grad, size-weighted mean of
    the state dicts) on the same clients and batches gives fedbug's weights, levers off."""
    cfg = tiny_config(**CNN, rounds=1, local_steps=5, memory_format="contiguous")
    res = run_experiment(cfg)
    exp = Experiment(cfg)
    ds = exp.dataset
    model = build_model(cfg.model, ds.input_shape, ds.num_classes, cfg.seed)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in start.items()}
    n_all = 0
    for i in res.records[0]["clients"]:
        idx = exp.parts[i]
        xs, ys = ds.train_x[idx], ds.train_y[idx]
        n = len(idx)
        model.load_state_dict(start)
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        gen = torch_generator(cfg.seed, "client", 1, i)
        per_epoch = -(-n // cfg.batch_size)
        for k in range(cfg.local_steps):
            pos = k % per_epoch
            if pos == 0:
                perm = torch.randperm(n, generator=gen)
            b = perm[pos * cfg.batch_size : (pos + 1) * cfg.batch_size]
            loss = F.cross_entropy(model(ds.prepare(xs[b])), ys[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        for key, v in model.state_dict().items():
            total[key] += n * v.double()
        n_all += n
    bare = torch.cat([(total[k] / n_all).float().reshape(-1) for k in exp.space.names])
    torch.testing.assert_close(res.weights, bare, atol=1e-6, rtol=1e-5)
    assert not torch.equal(res.weights, exp.initial_weights())


def test_channels_last_equals_contiguous():
    base = tiny_config(**CNN, algorithm="feddyn", rounds=2)
    a = run_experiment(base.model_copy(update={"memory_format": "contiguous"}))
    b = run_experiment(base.model_copy(update={"memory_format": "channels_last"}))
    torch.testing.assert_close(a.weights, b.weights, atol=1e-5, rtol=0)
    for ra, rb in zip(a.records, b.records):
        assert abs(ra["test_loss"] - rb["test_loss"]) < 1e-5
        assert abs(ra["train_loss"] - rb["train_loss"]) < 1e-5
    exp = Experiment(base.model_copy(update={"memory_format": "channels_last"}))
    x = exp.make_runtime().prepare(exp.dataset.train_x[:4])
    assert x.shape[1] == 1 and x.stride() == (64, 1, 8, 1)  # NHWC strides even for 1 channel
    out = exp.make_runtime().model.conv1(x)
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()


def test_personalized_evaluation_follows_the_memory_format():
    pfl = {"evaluation": "personalized", "partition": "dirichlet_classwise"}
    cfg = tiny_config(**CNN, **pfl, memory_format="channels_last", num_clients=4)
    exp = Experiment(cfg)
    seen = []
    conv1 = exp.personal.model.conv1
    conv1.register_forward_hook(lambda _m, _a, out: seen.append(out.is_contiguous()))
    exp.personal.evaluate(exp.initial_weights(), ClientStates(exp.algorithm, exp.space).get)
    assert seen and not any(seen)  # NHWC convolution outputs, not NCHW


def _backward_ops(exp: Experiment, frozen: set[int]) -> list[tuple[str, list]]:
    """(name, output mask) of each convolution_backward in one training step of ``exp``'s model
    with the given units frozen, from torch.profiler."""
    rt = exp.make_runtime()
    x = rt.prepare(exp.dataset.train_x[:16])
    y = exp.dataset.train_y[:16]
    rt.set_trainable(tuple(u for u in range(exp.space.num_units) if u not in frozen))
    acts = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
        F.cross_entropy(rt.model(x), y).backward()
    return [
        (e.name, e.concrete_inputs[-1] if e.concrete_inputs else None)
        for e in prof.events()
        if e.name == "aten::convolution_backward"
    ]


def test_profiler_frozen_unit_weight_gradient_kernel_does_not_run():
    exp = Experiment(tiny_config(**CNN))
    assert [u.name for u in exp.units][:2] == ["conv1", "conv2"]
    everything = _backward_ops(exp, set())
    first_frozen = _backward_ops(exp, {0})
    # all trainable: both convolutions' backward kernels run; conv1 frozen (and the input needs
    # no gradient): its kernel does not run at all, the backward pass stops above it
    assert len(everything) == 2
    assert len(first_frozen) == 1
    # conv2 frozen under a trainable conv1: conv2's backward runs for the input gradient only
    # (output_mask [input, weight, bias] = [True, False, False]); conv1's computes weights only
    masks = sorted(m for _, m in _backward_ops(exp, {1}))
    assert masks == [[False, True, True], [True, False, False]]
    assert first_frozen[0][1] == [False, True, True]  # conv2: weight and bias; no input grad


def test_evaluation_runs_under_inference_mode():
    exp = Experiment(tiny_config(threads=1))
    seen = []
    exp.evaluator.model.register_forward_hook(
        lambda *_: seen.append(torch.is_inference_mode_enabled())
    )
    exp.evaluator.evaluate(exp.initial_weights())
    assert seen and all(seen)


def test_one_runtime_serves_every_client_and_round():
    """The reusable model: training a client leaves nothing that changes the next one."""
    exp = Experiment(tiny_config(**CNN))
    rt = exp.make_runtime()
    w = exp.initial_weights()
    t = ClientTask(1, 2, 0, 0.1, exp.mean_samples)
    first = train_client(w, t, exp.client_data(2), {}, rt)
    train_client(w, ClientTask(1, 3, 0, 0.1, exp.mean_samples), exp.client_data(3), {}, rt)
    again = train_client(w, t, exp.client_data(2), {}, rt)
    assert torch.equal(first.delta, again.delta)
