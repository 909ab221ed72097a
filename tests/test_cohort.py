"""``executor: cohort`` (a round's clients as one vectorised step): the sequential executor's
numbers within float32 rounding for every algorithm x policy pair it accepts (registry-driven),
unequal rounds, chunks, resume, and one-line refusals of what it cannot vectorise.

Tolerance: a batched kernel (vmap folds the clients into one convolution / matmul) sums in
another order than one client's kernel, so a gradient differs in its last bits (~1e-7
relative); over a few steps that stays far below 1e-4 of each unit's change, the figure the
equivalence harness holds references to (benchmarks/equivalence/README.md)."""

import pytest
import torch
from tiny import BatchNormNet, method_needs, tiny_config, without_timing

from fedbug.algorithms import ALGORITHMS
from fedbug.core.protocol import ClientTask
from fedbug.engine import run_experiment
from fedbug.engine.experiment import Experiment
from fedbug.errors import ConfigError
from fedbug.policies import POLICIES

FLOATS = ("train_loss", "test_loss", "test_acc", "client_drift")


#: unequal clients of one local epoch, one thread: where Adam's per-unit step counts differ
#: between a group's clients (the Adam tests here and tests/test_optimizers.py)
UNEQUAL_EPOCH = {
    "partition": "iid",
    "unbalanced_sigma": 0.8,
    "local_steps": None,
    "local_epochs": 1,
    "batch_size": 8,
    "threads": 1,
}


def pair_config(algorithm, policy, **over):
    has_global = ALGORITHMS.get(algorithm).has_global_model
    return tiny_config(
        algorithm=algorithm,
        policy=policy,
        evaluation="global" if has_global else "personalized",
        finetune_epochs=1,
        **{**method_needs(algorithm, policy), **over},
    )


def pairs():
    """Every valid algorithm x policy pair the cohort executor accepts (its config-time check
    decides; pairs invalid under every executor are left out)."""
    out = []
    for a in ALGORITHMS.names():
        for p in POLICIES.names():
            try:
                pair_config(a, p)
            except ConfigError:
                continue
            try:
                pair_config(a, p, executor="cohort")
            except ConfigError as e:
                assert "executor: cohort" in str(e), e
                continue
            out.append((a, p))
    return out


def assert_close_to_sequential(cfg, tol=1e-4):
    seq = run_experiment(cfg)
    coh = run_experiment(cfg.model_copy(update={"executor": "cohort"}))
    exp = Experiment(cfg)
    start = exp.initial_weights()
    for sl in exp.space.unit_slices:  # each unit within tol of its own change
        change = float((seq.weights[sl] - start[sl]).abs().max())
        diff = float((coh.weights[sl] - seq.weights[sl]).abs().max())
        assert diff <= tol * max(change, 1e-6), (sl, diff, change)
    a, b = without_timing(seq.records), without_timing(coh.records)
    assert len(a) == len(b)
    for ra, rb in zip(a, b):
        assert {k: v for k, v in ra.items() if k not in FLOATS} == {
            k: v for k, v in rb.items() if k not in FLOATS
        }
        for k in FLOATS:
            if ra.get(k) is not None:
                assert rb[k] == pytest.approx(ra[k], rel=1e-5, abs=1e-6), k
    return seq, coh


def test_the_accepted_pairs_cover_the_plain_and_personalised_families():
    accepted = pairs()
    families = {"fedavg", "local", "fedper", "fedbabu", "fedprox", "feddyn", "scaffold"}
    assert families | {"feddecorr"} <= {a for a, _ in accepted}
    assert {"none", "bottom_up", "top_down", "fedpart"} <= {p for _, p in accepted}


@pytest.mark.parametrize("algorithm, policy", pairs())
def test_every_accepted_pair_gives_the_sequential_numbers(algorithm, policy):
    cfg = pair_config(algorithm, policy, momentum=0.9, clip_grad_norm=1.0, threads=1)
    assert_close_to_sequential(cfg)


@pytest.mark.parametrize(
    "over",
    [
        {"policy": "bottom_up", "momentum": 0.9, "clip_grad_norm": 1.0, "model": "digits_cnn"},
        {"algorithm": "feddecorr"},
        {"algorithm": "scaffold", "momentum": 0.9},
        {"optimizer": "adam", "lr": 0.01, "policy": "bottom_up", **UNEQUAL_EPOCH},
    ],
)
def test_each_clients_own_gradient_on_streams_gives_the_sequential_numbers(over):
    """cohort: {gradient: streams}: each client's gradient with the sequential step's kernels
    (its own forward and backward, not a vectorised map), clients in turn on the CPU: the
    sequential executor's numbers (within float32 rounding: the stacked optimiser's)."""
    algorithm, policy = over.get("algorithm", "fedavg"), over.get("policy", "none")
    cfg = tiny_config(
        **{"threads": 1, **method_needs(algorithm, policy), **over},
        cohort={"gradient": "streams"},
    )
    assert_close_to_sequential(cfg)


@pytest.mark.parametrize(
    "augment, algorithm, policy",
    [
        ("flip", "fedavg", "bottom_up"),
        ("crop_flip", "fedavg", "bottom_up"),
        # FedBABU never trains the head, so top-down's first steps are idle: an idle step
        # takes its draws too (the sequential executor's batch is drawn before its units)
        ("flip", "fedbabu", "top_down"),
    ],
)
def test_augmented_batches_give_the_sequential_numbers(augment, algorithm, policy):
    """Each client's augmentation drawn from its own generator as its step comes, idle steps
    included, applied to the group's batches at once: unequal clients (groups of scattered
    rows, short last batches), gradual unfreezing, chunks of two; and the augmentation changes
    the numbers (it is not skipped)."""
    cfg = pair_config(
        algorithm,
        policy,
        model="digits_cnn",
        augment=augment,
        momentum=0.5,
        cohort={"max_clients": 2},
        **{policy: {"gu_ratio": 0.5}},
        **UNEQUAL_EPOCH,
    )
    _, coh = assert_close_to_sequential(cfg)
    plain = run_experiment(cfg.model_copy(update={"executor": "cohort", "augment": "none"}))
    assert not torch.equal(plain.weights, coh.weights)


def test_unequal_rounds_partial_batches_and_a_conv_model():
    """Clients of different sizes (epochs of different step counts, a short last batch): the
    longer rounds go on alone; the digits CNN through vmap's batched convolutions; FedBug's
    gradual unfreezing; FLOPs and memory counted as the sequential executor counts them."""
    cfg = tiny_config(
        model="digits_cnn",
        local_steps=None,
        local_epochs=1,
        partition="iid",
        unbalanced_sigma=0.8,
        batch_size=8,
        policy="bottom_up",
        bottom_up={"gu_ratio": 0.5},
        momentum=0.5,
        count_flops=True,
        threads=1,
    )
    exp = Experiment(cfg)
    assert len({exp.sizes[c] for c in range(exp.num_clients)}) > 1
    assert_close_to_sequential(cfg)


def test_chunks_of_clients_give_the_same_numbers():
    cfg = tiny_config(executor="cohort", threads=1)
    whole = run_experiment(cfg)
    one_by_one = run_experiment(
        tiny_config(executor="cohort", threads=1, cohort={"max_clients": 1})
    )
    assert torch.allclose(whole.weights, one_by_one.weights, atol=1e-6)


@pytest.mark.parametrize(
    "over",
    [
        {"momentum": 0.9, "weight_decay": 0.01, "algorithm": "fedprox"},
        {"optimizer": "adam", "lr": 0.01, "policy": "bottom_up", "bottom_up": {"gu_ratio": 0.5}},
    ],
)
def test_consecutive_rows_as_views_equal_gathered_rows_bit_for_bit(monkeypatch, over):
    """A group of consecutive rows is stepped in place through views of the stacked vectors;
    gathered and written back instead (as rows that are not consecutive are), every number is
    the same, to the bit: the same operations in the same order."""
    from fedbug.engine.executors import cohort

    needs = method_needs(over.get("algorithm", "fedavg"), over.get("policy", "none"))
    cfg = tiny_config(executor="cohort", threads=1, **{**needs, **over})
    views = run_experiment(cfg)
    made = cohort.Rows.of

    def gathered(clients, device):
        rows = made(clients, device)
        assert rows.span is not None or len(clients) < 2 or list(clients) != sorted(clients)
        return rows._replace(span=None)

    monkeypatch.setattr(cohort.Rows, "of", gathered)
    copies = run_experiment(cfg)
    assert torch.equal(views.weights, copies.weights)
    assert without_timing(views.records) == without_timing(copies.records)


def test_rows_of_consecutive_clients_are_a_slice():
    from fedbug.engine.executors.cohort import Rows

    cpu = torch.device("cpu")
    assert Rows.of([2, 3, 4], cpu).span == slice(2, 5)
    assert Rows.of([0, 2], cpu).span is None
    t, sums = torch.arange(12.0).view(4, 3), torch.zeros(4)
    for clients in ([1, 2], [3, 1]):
        rows = Rows.of(clients, cpu)
        assert torch.equal(rows.take(t), t[clients])
        rows.add(sums, torch.tensor([10.0, 20.0]))
    assert sums.tolist() == [0.0, 30.0, 20.0, 10.0]  # row 1: 10 + 20, row 3: 10
    region = Rows.of([0, 2], cpu).region(t, slice(1, 3))
    region.mul_(0)
    Rows.of([0, 2], cpu).write(t, slice(1, 3), region)
    assert t[0].tolist() == [0.0, 0.0, 0.0] and t[2, 1:].tolist() == [0.0, 0.0]


def test_a_resumed_cohort_run_equals_the_uninterrupted_one(tmp_path):
    cfg = tiny_config(executor="cohort", rounds=3, checkpoint_every=1, threads=1)
    full = run_experiment(cfg, tmp_path / "full")
    run_experiment(cfg, tmp_path / "cut", stop_after=2)
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)
    assert torch.equal(resumed.weights, full.weights)


@pytest.mark.parametrize(
    "over, message",
    [
        ({"algorithm": "fedrod", "evaluation": "personalized"}, "algorithm fedrod acts inside"),
        ({"precision": "bf16"}, r"not precision bf16; use precision: fp32 \(or tf32 on a GPU\)"),
        ({"dp_sgd": {}}, "per-sample gradients; remove dp_sgd, or use executor: sequential$"),
    ],
)
def test_config_refusals(over, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(executor="cohort", **over)


class WithDropout(BatchNormNet):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.Dropout(0.5)


class WithTwoDropouts(BatchNormNet):
    """A dropout of rate 0 (no masks drawn) before the one that draws them."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Flatten(), torch.nn.Dropout(0.0), torch.nn.Linear(64, 8)
        )
        self.norm = torch.nn.Dropout(0.5)


@pytest.mark.parametrize(
    "model, over, message",
    [
        (BatchNormNet, {}, "cannot update buffers"),
        (WithDropout, {}, "dropout masks"),
        (WithTwoDropouts, {}, r"dropout masks \(norm\)"),  # named: the one that draws masks
    ],
)
def test_model_and_data_refusals_leave_no_run_folder(tmp_path, model, over, message):
    import fedbug

    with pytest.raises(ConfigError, match=message):
        fedbug.run(tiny_config(executor="cohort", **over), tmp_path / "r", model=model)
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


@pytest.mark.parametrize("clip", ["all", "loss"])
def test_feddyn_per_client_alpha_and_state_under_both_clips(clip):
    """FedDyn's alpha_i differs per client (unbalanced sizes) and lambda_i is per-client state
    read inside the step: the stacked context carries both."""
    cfg = pair_config(
        "feddyn",
        "bottom_up",
        bottom_up={"gu_ratio": 0.5},
        feddyn={"clip": clip},
        partition="iid",
        unbalanced_sigma=0.8,
        clip_grad_norm=1.0,
        rounds=3,
        threads=1,
    )
    assert_close_to_sequential(cfg)


def test_a_subclass_overriding_a_vectorised_hook_must_declare_it_again():
    from fedbug.algorithms.fedprox import FedProx
    from fedbug.config.cohort import _vectorised

    class Mine(FedProx):
        def adjust_grads(self, ctx):
            return None

    assert _vectorised(FedProx, "adjust_grads")
    assert not _vectorised(Mine, "adjust_grads")


@pytest.mark.parametrize("method", ["fedseq-vanilla", "fedseq-anti"])
def test_fedseq_round_schedules(method):
    assert_close_to_sequential(tiny_config(method=method, threads=1, rounds=3))


@pytest.mark.parametrize(
    "algorithm, policy, over",
    [
        ("fedavg", "bottom_up", {"bottom_up": {"gu_ratio": 0.5}}),
        ("fedprox", "none", {"weight_decay": 0.01}),
    ],
)
def test_adam_with_step_counts_per_client_and_unit(algorithm, policy, over):
    """Adam's bias corrections read each unit's own step count, which gradual unfreezing and
    unequal client sizes make differ between the clients of a group."""
    cfg = pair_config(algorithm, policy, optimizer="adam", lr=0.01, **UNEQUAL_EPOCH, **over)
    assert_close_to_sequential(cfg)


def test_a_memory_budget_sizes_the_chunks():
    """One client's share (its full step's counted memory, its rows of the stacked vectors and
    its prepared samples) sets how many a budget holds; a budget below one client still trains
    one at a time."""
    from fedbug.engine.executors import build_executor

    cfg = tiny_config(executor="cohort", threads=1, momentum=0.9)
    exp = Experiment(cfg)
    ex = build_executor(exp, None)
    tasks = [ClientTask(1, c, 0, 0.1, exp.mean_samples) for c in range(3)]
    per = ex.client_bytes(tasks[0]) + ex.sample_bytes(tasks)
    rows = 3 + 1  # weights, received, gradient; momentum
    assert ex.client_bytes(tasks[0]) > 4 * exp.space.total * rows
    ex.memory_mb = 2.5 * per / 2**20
    assert ex.chunk_size(tasks) == 2
    ex.memory_mb = 0.5 * per / 2**20
    assert ex.chunk_size(tasks) == 1
    small = run_experiment(cfg.model_copy(update={"cohort": type(cfg.cohort)(memory_mb=1e-3)}))
    whole = run_experiment(cfg)
    assert torch.allclose(small.weights, whole.weights, atol=1e-6)


@pytest.mark.parametrize("probe", ["rollback", "restart"])
def test_freezefl_probe_epoch_restores_or_restarts_per_client(probe):
    """FreezeFL decides after its probe epoch, on the client's own weights, how many units to
    freeze: restored to the received weights (rollback) or the round started over with a fresh
    optimiser (restart); each client's row goes through the policy's answer. (Two rounds at
    momentum 0.5: with 0.9 and three rounds of these tiny clients both executors' rounding is
    amplified past the tolerance, FreezeFL's or not: 1e-6 of the change after one round.)"""
    cfg = pair_config(
        "fedavg",
        "freezefl",
        freezefl={"probe": probe},
        local_steps=None,
        local_epochs=2,
        batch_size=16,
        momentum=0.5,
        rounds=2,
        threads=1,
    )
    seq, _ = assert_close_to_sequential(cfg)
    frozen = [pc["n_frozen"] for r in seq.records for pc in r["per_client"] if "n_frozen" in pc]
    assert any(n > 0 for n in frozen), frozen  # some client froze: the answer was exercised


def test_a_memory_budget_counts_a_full_batch_whatever_the_first_clients_size():
    """Clients of 125, 68, 235, 420, 380 and 118 samples, batches of 200: a chunk led by client
    1 (68 samples) still trains other clients' full batches of 200, so its share is a full
    batch's, the same as when client 2 (235 samples) leads it."""
    from fedbug.engine.executors import build_executor

    cfg = tiny_config(executor="cohort", threads=1, partition="iid", unbalanced_sigma=0.8)
    cfg = cfg.model_copy(update={"batch_size": 200})
    exp = Experiment(cfg)
    assert exp.sizes[1] < 200 < exp.sizes[2]
    ex = build_executor(exp, None)
    small, big = (ClientTask(1, c, 0, 0.1, exp.mean_samples) for c in (1, 2))
    assert ex.client_bytes(small) == ex.client_bytes(big)


def test_a_memory_budget_counts_the_largest_clients_prepared_samples():
    """Each client's samples are prepared once a round (float32: 64 features x 4 bytes a digit
    for the MLP): a chunk's share per client adds the round's largest client's."""
    from fedbug.engine.executors import build_executor

    cfg = tiny_config(executor="cohort", threads=1, partition="iid", unbalanced_sigma=0.8)
    exp = Experiment(cfg)
    ex = build_executor(exp, None)
    tasks = [ClientTask(1, c, 0, 0.1, exp.mean_samples) for c in range(len(exp.sizes))]
    assert ex.sample_bytes(tasks) == max(exp.sizes) * 64 * 4
    ex.memory_mb = 2.5 * (ex.client_bytes(tasks[0]) + ex.sample_bytes(tasks)) / 2**20
    assert ex.chunk_size(tasks) == 2


def test_a_memory_budget_counts_the_raw_samples_of_an_augmented_round():
    """Under augmentation nothing is prepared once (each batch is augmented, then prepared, at
    its step): the chunk holds its clients' samples as the data set keeps them, and counts
    those."""
    from fedbug.engine.executors import build_executor

    cfg = tiny_config(
        executor="cohort", threads=1, partition="iid", unbalanced_sigma=0.8, augment="flip"
    )
    exp = Experiment(cfg)
    ex = build_executor(exp, None)
    tasks = [ClientTask(1, c, 0, 0.1, exp.mean_samples) for c in range(len(exp.sizes))]
    raw = exp.dataset.train_x[:1]
    assert ex.sample_bytes(tasks) == max(exp.sizes) * raw.numel() * raw.element_size() > 0


def test_a_memory_budget_counts_the_clients_state():
    """SCAFFOLD's c_i is one more full vector a client brings to the chunk (stacked in the
    chunk, as its weights are, and gathered again for each group step): its share is FedAvg's
    plus 2 x 4 bytes an entry."""
    from fedbug.engine.executors import build_executor

    def share(algorithm):
        exp = Experiment(tiny_config(executor="cohort", threads=1, algorithm=algorithm))
        task = ClientTask(1, 0, 0, 0.1, exp.mean_samples)
        return build_executor(exp, None).client_bytes(task), exp.space.total

    (plain, total), (scaffold, _) = share("fedavg"), share("scaffold")
    assert scaffold == plain + 2 * 4 * total


def test_a_loss_vmap_cannot_map_is_one_line_naming_the_executor():
    """A user loss that reads a number out of a tensor (.item()) is not a pure function of its
    inputs: vmap refuses it, and the run stops with one ConfigError (no traceback from torch)."""
    import fedbug

    def impure(output, y):
        scale = float(output.detach().abs().mean().item())  # data-dependent control flow
        return torch.nn.functional.cross_entropy(output, y) * scale

    with pytest.raises(ConfigError, match="executor: cohort maps the loss"):
        fedbug.run(tiny_config(executor="cohort", threads=1, rounds=1), loss=impure)
