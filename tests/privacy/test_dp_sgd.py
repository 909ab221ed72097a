"""Sample-level DP-SGD on the client (``dp_sgd:``, Opacus's per-sample gradients): the clip and
the noise on the trainable units only, the per-client accountant, resume, the refusals."""

import json
import math

import pytest
import torch
from tiny import BatchNormNet, tiny_config, without_timing

pytest.importorskip("opacus")
pytest.importorskip("dp_accounting")

from fedbug.cli import main  # noqa: E402
from fedbug.core.protocol import SampleDP  # noqa: E402
from fedbug.engine import run_experiment  # noqa: E402
from fedbug.engine.privacy.accountant import SampleAccountant  # noqa: E402
from fedbug.engine.privacy.sample_level import PerSampleGradients, refuse_unsupported  # noqa: E402
from fedbug.errors import ConfigError  # noqa: E402

DP_SGD = {"clip": 1.0, "noise_multiplier": 1.0}


class Score(torch.nn.Module):
    """A bias-free Linear(d, 1) whose loss is the batch mean of w.x: sample i's gradient is
    x_i, so clipping can be worked by hand."""

    def __init__(self, d: int = 2) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(d, 1, bias=False)

    def forward(self, x):
        return self.lin(x)


def private_grad(model, x, params, key=(0,)):
    ps = PerSampleGradients(model, SampleDP(**params))
    p = model.lin.weight
    p.grad = torch.zeros_like(p)
    view = p.grad
    ps.backward(model(x).mean())
    ps.privatize(
        [(p, view)], batch_size=len(x), generator=torch.Generator().manual_seed(0), key=key
    )
    return view


def test_each_sample_is_clipped_then_summed_over_the_batch_size():
    """x_1 = (3, 4) has norm 5: clipped to (0.6, 0.8) by C = 1; x_2 = (0.3, 0.4), norm 0.5,
    is kept; (0.9, 1.2) / 2 = (0.45, 0.6). Without clipping the mean would be (1.65, 2.2)."""
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    g = private_grad(Score(), x, {"clip": 1.0, "noise_multiplier": 0.0})
    assert torch.allclose(g, torch.tensor([[0.45, 0.6]]), atol=1e-6)


def test_noise_has_std_z_clip_over_the_batch_size():
    """All-zero inputs give zero per-sample gradients, so the private gradient is the noise
    alone: std z C / B = 2 * 0.5 / 4 = 0.25 over 20,000 entries (seed 0; the sample std's own
    std is 0.25 / sqrt(2 * 20000) = 0.00125, so 0.005 is 4 of those)."""
    model = Score(20_000)
    g = private_grad(model, torch.zeros(4, 20_000), {"clip": 0.5, "noise_multiplier": 2.0})
    assert abs(float(g.std()) - 0.25) < 0.005
    assert abs(float(g.mean())) < 0.005


def test_per_sample_gradients_that_do_not_average_to_the_batch_gradient_are_refused():
    model = Score()
    ps = PerSampleGradients(model, SampleDP(clip=1.0, noise_multiplier=0.0))
    p = model.lin.weight
    p.grad = torch.zeros_like(p)
    ps.backward(model(torch.ones(2, 2)).mean())
    p.grad.add_(1.0)  # as if the forward were not the module's own
    with pytest.raises(ConfigError, match="do not average to its batch gradient"):
        ps.privatize([(p, p.grad)], 2, torch.Generator(), (0,))


def test_poisson_batches_have_the_expected_size_and_can_be_empty():
    ps = PerSampleGradients(Score(), SampleDP(clip=1.0, noise_multiplier=1.0))
    g = torch.Generator().manual_seed(0)
    sizes = [len(ps.poisson_batch(1000, 50, g)) for _ in range(200)]
    assert abs(sum(sizes) / len(sizes) - 50) < 2  # q = 0.05: 50 a batch on average
    assert min(len(ps.poisson_batch(20, 1, g)) for _ in range(200)) == 0  # q = 0.05 of 20


def test_accountant_matches_the_published_epsilon_and_opacus():
    """TF Privacy's tutorial setting (q = 250/60000, z = 1.3, 3600 steps: (1.18, 1e-5)-DP by
    the classic conversion; 0.942 by the tighter one dp-accounting and Opacus both use; see
    test_dp.py's client-level twin). A client of 60,000 samples and batches of 250."""
    acc = SampleAccountant(1.3, 1e-5, 250)
    acc.spend(0, 60000, 1800)
    acc.spend(0, 60000, 1800)  # two rounds of 1800 local steps
    assert acc.epsilon(0) == pytest.approx(0.942, abs=0.001)
    from opacus.accountants import RDPAccountant

    opacus = RDPAccountant()
    opacus.history = [(1.3, 250 / 60000, 3600)]
    assert acc.epsilon(0) == pytest.approx(opacus.get_epsilon(1e-5), rel=1e-6)
    acc.spend(1, 600, 10)  # q = 250/600: fewer steps, far larger rate
    assert acc.worst() == max(acc.epsilon(0), acc.epsilon(1))
    assert SampleAccountant(0.0, 1e-5, 250).epsilon(0) == 0.0


def dp_config(**over):
    doc = dict(dp_sgd=DP_SGD, rounds=3, checkpoint_every=1)
    doc.update(over)
    return tiny_config(**doc)


def test_run_records_epsilon_per_client_and_resumes_bitwise(tmp_path):
    cfg = dp_config()
    full = run_experiment(cfg, tmp_path / "full")
    run_experiment(cfg, tmp_path / "cut", stop_after=2)
    resumed = run_experiment(cfg, tmp_path / "cut", resume=True)
    assert without_timing(resumed.records) == without_timing(full.records)
    assert torch.equal(resumed.weights, full.weights)
    eps = [r["dp_sgd_epsilon"] for r in full.records]
    assert 0 < eps[0] <= eps[1] <= eps[2]
    assert all(steps == 3 for r in full.records for steps in r["dp_sgd_steps"].values())
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())["dp_sgd"]
    assert summary["epsilon"] == eps[2]
    assert summary["clients"] == len({c for r in full.records for c in r["dp_sgd_steps"]})
    plain = run_experiment(tiny_config(rounds=3))
    assert not torch.equal(plain.weights, full.weights)


def test_no_noise_and_no_clip_with_shuffled_batches_is_plain_sgd():
    private = run_experiment(
        dp_config(dp_sgd={"clip": 1e6, "noise_multiplier": 0.0, "sampling": "shuffle"})
    )
    plain = run_experiment(tiny_config(rounds=3))
    assert torch.allclose(private.weights, plain.weights, atol=1e-6)


def test_frozen_units_get_no_noise_and_no_per_sample_gradients():
    """fixed_head (the head frozen, gradients flowing through it to the body): the head keeps
    the received weights despite the noise, and the step's gradient memory is the body's
    (B + 1 copies: its gradient and the batch's per-sample gradients)."""
    from fedbug.engine.experiment import Experiment

    shuffled = DP_SGD | {"sampling": "shuffle"}
    cfg = dp_config(policy="fixed_head", rounds=1, dp_sgd=shuffled)
    run = run_experiment(cfg)
    whole = run_experiment(dp_config(rounds=1, dp_sgd=shuffled))
    exp = Experiment(cfg)
    head = exp.space.unit_slices[-1]
    moved = (run.weights - exp.initial_weights()).abs()
    assert float(moved[head].max()) == 0.0
    assert float(moved[: head.start].max()) > 0.0
    grads = run.records[0]["peak_mem_parts"]["gradients"]
    assert grads == 4 * (cfg.batch_size + 1) * head.start
    assert whole.records[0]["peak_mem_parts"]["gradients"] > grads


def test_a_batchnorm_model_is_refused_naming_the_module_and_the_fix():
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2))
    with pytest.raises(ConfigError, match=r"BatchNorm2d modules \(1 \(BatchNorm2d\)\).*GroupNorm"):
        refuse_unsupported(model)


@pytest.mark.parametrize(
    "over, message",
    [
        ({"algorithm": "feddecorr"}, "dp_sgd: clips each sample's gradient"),
        ({"precision": "bf16"}, "precision bf16"),
        ({"dp_sgd": {"noise_multiplier": -1.0}}, "noise_multiplier=-1.0 is negative"),
        ({"dp_sgd": {"delta": 1.5}}, r"delta=1.5 is not in \(0, 1\)"),
    ],
)
def test_refusals(over, message):
    with pytest.raises(ConfigError, match=message):
        dp_config(**over)


def test_a_batchnorm_run_is_refused_before_anything_is_written(tmp_path):
    import fedbug

    with pytest.raises(ConfigError, match="BatchNorm1d modules \\(norm"):
        fedbug.run(dp_config(), tmp_path / "r", model=BatchNormNet)
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_bad_dp_sgd_options_exit_2_with_one_line(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("dp_sgd: {clip: 1.0, noise_multiplier: -1.0}\n")
    rc = main(["run", str(cfg), "--out", str(tmp_path / "o"), "-q"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "dp_sgd.noise_multiplier=-1.0 is negative" in err


def test_epsilon_of_a_known_setting_grows_like_sqrt_steps_for_small_q():
    """A sanity bound: at small q the RDP epsilon grows sublinearly in the steps."""
    acc = SampleAccountant(1.0, 1e-5, 10)
    acc.spend(0, 10_000, 100)
    e100 = acc.epsilon(0)
    acc.spend(0, 10_000, 300)
    e400 = acc.epsilon(0)
    assert e100 < e400 < 4 * e100
    assert math.isfinite(e400)


def test_a_conv_model_trains_with_per_sample_gradients_checked():
    """The digits CNN runs channels_last by default, for which Opacus 1.6's conv grad sampler
    gives zero per-sample gradients; its hooks get NCHW copies, and the per-sample check (which
    failed before) runs on the first step of every client."""
    run = run_experiment(dp_config(model="digits_cnn", rounds=1, local_steps=2))
    assert run.records[0]["dp_sgd_epsilon"] > 0


@pytest.mark.slow
def test_worker_processes_give_the_sequential_numbers():
    cfg = dp_config(rounds=2, threads=1)
    seq = run_experiment(cfg)
    par = run_experiment(cfg.model_copy(update={"executor": "processes", "workers": 2}))
    assert without_timing(par.records) == without_timing(seq.records)
    assert torch.equal(par.weights, seq.weights)


def test_a_batch_larger_than_the_client_is_divided_by_the_client_size():
    """batch_size 4096 over clients of ~225 samples: q = min(1, B / n) = 1, every sample in
    every step, so the expected batch (Abadi et al.'s lot, Opacus's expected_batch_size) is n,
    not B. Without clip (C = 1e6) or noise the step is then plain full-batch SGD; dividing by B
    would shrink it by n / B (about 0.055)."""
    over = dict(batch_size=4096, rounds=1, count_flops=False, threads=1)
    private = run_experiment(dp_config(dp_sgd={"clip": 1e6, "noise_multiplier": 0.0}, **over))
    plain = run_experiment(tiny_config(**over))
    assert torch.allclose(private.weights, plain.weights, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["fedrod", "heterofl"])
def test_a_loss_reading_the_clients_whole_label_set_is_refused(algorithm):
    """FedRoD's balanced softmax adds log n_c (the client's class counts) to every sample's
    logits, HeteroFL's masked loss zeroes the logits of classes the client lacks: one sample
    more or less changes every other sample's clipped gradient, so the sum's sensitivity is not
    C and the epsilon reported would not hold (both ran before, FedRoD reporting eps 2.17);
    both declare ``loss_per_sample = False``."""
    from tiny import method_needs

    from fedbug.algorithms import ALGORITHMS

    evaluation = "global" if ALGORITHMS.get(algorithm).has_global_model else "personalized"
    with pytest.raises(ConfigError, match="dp_sgd"):
        dp_config(algorithm=algorithm, evaluation=evaluation, **method_needs(algorithm, "none"))
    assert not ALGORITHMS.get(algorithm).loss_per_sample


@pytest.mark.parametrize("algorithm", ["fjord", "slt"])
def test_a_model_run_on_substituted_weights_is_refused_in_one_line(algorithm):
    """The width methods run each step on masked copies of the weights (functional_call): the
    layers' parameters are then plain tensors Opacus's hooks cannot count (an AttributeError
    deep in Opacus before); refused with the config, naming dp_sgd (the hook's own refusal
    stays for a wrapper no class declares)."""
    from tiny import method_needs

    over = {"rounds": 1, "threads": 1, "finetune_epochs": 0, **method_needs(algorithm, "none")}
    with pytest.raises(ConfigError, match="dp_sgd: .*substituted"):
        run_experiment(dp_config(algorithm=algorithm, **over))
