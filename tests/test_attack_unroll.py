"""Inverting Gradients' unrolled attack (issue 32, item 1; Geiping et al. 2020, section 6): the
client's local steps replayed on the dummy inputs, each step's units asked of the run's own
policy and algorithm. On the recorded truth in its batch order the replay gives the update the
server received to float rounding, where matching it as one gradient misses by far."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedbug.attack.driver import build_attacked_model, choose_method, observation, run_config
from fedbug.attack.driver import unrolled as unrolled_observation
from fedbug.attack.inversion import Observation, Unroll, unrolled_update
from fedbug.attack.replay import attack_mode, replay_error
from fedbug.cli import main
from fedbug.results.updates import load_update, recorded


def tiny_run(tmp_path, *extra: str):
    from fedbug.api import run
    from fedbug.config import load_config

    sets = ["dataset=digits", "model=mlp", "num_clients=4", "clients_per_round=1", "rounds=2"]
    sets += ["batch_size=2", "local_steps=4", "count_flops=false", "threads=1"]
    sets += ["record_updates=[1]", *extra]
    return run(load_config(None, sets), tmp_path / "run").run_dir


def first_update(folder):
    up = load_update(folder, 1, recorded(folder)[1][0])
    model = build_attacked_model(up, run_config(folder))
    attack_mode(model)
    return run_config(folder), up, model


@pytest.mark.parametrize(
    "extra",
    [
        ("momentum=0.9", "weight_decay=0.001"),
        ("policy=bottom_up", "bottom_up.gu_ratio=1.0", "momentum=0.9"),  # FedBug
        ("policy=top_down", "top_down.gu_ratio=0.5"),
        ("clip_grad_norm=0.05",),
        ("algorithm=fedbabu",),  # the head never trains
        ("method=fedseq-vanilla", "rounds=4"),  # FedSeq's round schedule
        # a personal head: trained, not sent (in round 1 the client's is the received one)
        ("algorithm=fedper", "evaluation=personalized"),
        (
            "algorithm=fedrep",
            "evaluation=personalized",
            "fedrep.head_epochs=1",
            "local_epochs=1",
            "clip_grad_norm=0.5",
        ),  # of the 4 steps, 2 on the head, then 2 on the base; clipped over what trains
        ("num_clients=400", "local_steps=null", "local_epochs=1", "batch_size=3"),  # 4 = 3 + 1
    ],
    ids=[
        "momentum",
        "fedbug",
        "top-down",
        "clipped",
        "fedbabu",
        "fedseq",
        "fedper",
        "fedrep",
        "last-batch",
    ],
)
def test_the_replay_of_the_truth_gives_the_update_where_one_gradient_misses(tmp_path, extra):
    cfg, up, model = first_update(tiny_run(tmp_path, *extra))
    obs, err, found = unrolled_observation(cfg, up, model)
    assert err is not None and err < 1e-5
    assert replay_error(observation(up, model), up.inputs, up.labels) > 0.1
    assert found == []  # 4 steps of one epoch, a policy the config tells: nothing guessed


def test_fedbugs_schedule_is_the_policys_hand_worked_one(tmp_path):
    """Gradual unfreezing over all K = 4 steps of the 3-unit MLP (P = 1): a unit every 4/3
    steps, so steps 1-4 train units {1}, {1, 2}, {1, 2, 3}, {1, 2, 3}."""
    cfg, up, model = first_update(tiny_run(tmp_path, "policy=bottom_up", "bottom_up.gu_ratio=1"))
    obs, _, _ = unrolled_observation(cfg, up, model)
    layers = [sorted({n.rsplit(".", 1)[0] for n in step}) for step in obs.unroll.trained]
    assert layers == [
        ["hidden.0"],
        ["hidden.0", "hidden.1"],
        ["classifier", "hidden.0", "hidden.1"],
        ["classifier", "hidden.0", "hidden.1"],
    ]


def test_a_step_differentiates_at_the_current_weights_only():
    """Layer 0 trains at step 1, layers 0 and 2 at step 2: step 2's gradient of layer 2 is
    the partial derivative at its weights, as torch's optimiser takes it, not through step 1's
    gradient of layer 0 (which read layer 2's weights)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 1, 0])
    steps = [("0.weight", "0.bias"), ("0.weight", "0.bias", "2.weight", "2.bias")]
    client = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    client.load_state_dict(model.state_dict())
    opt = torch.optim.SGD(client.parameters(), lr=0.5, momentum=0.5)
    for k, names in enumerate(steps):
        for n, p in client.named_parameters():
            p.requires_grad_(n in names)
            p.grad = None
        nn.functional.cross_entropy(client(x[2 * k : 2 * k + 2]), y[2 * k : 2 * k + 2]).backward()
        opt.step()
    before = dict(model.named_parameters())
    target = {n: (before[n] - p).detach() for n, p in client.named_parameters()}
    obs = Observation(model, target, (4,), 4, 2, unroll=Unroll(steps, 0.5, 2, 2, momentum=0.5))
    got = unrolled_update(obs, x, nn.functional.one_hot(y, 2).float())
    for n in target:
        torch.testing.assert_close(got[n], target[n], rtol=1e-6, atol=1e-7)


def test_auto_unrolls_one_clients_steps_and_not_an_average_of_several(tmp_path):
    _, up, model = first_update(tiny_run(tmp_path))
    obs = observation(up, model)
    assert choose_method("auto", obs, 4) == "ig-unrolled"
    assert choose_method("auto", obs, 4, clients=3) == "ig"
    assert choose_method("auto", obs, 1) in ("dlg", "idlg")


def test_unrolling_a_release_of_several_clients_is_one_line_exit_2(tmp_path, capsys):
    from fedbug.api import run
    from fedbug.config import load_config

    sets = ["dataset=digits", "model=mlp", "num_clients=4", "clients_per_round=2", "rounds=2"]
    sets += ["local_steps=2", "count_flops=false", "threads=1", "record_updates=[1, 2]"]
    folder = run(load_config(None, sets), tmp_path / "run").run_dir
    args = ["attack", str(folder), "--released", "--method", "ig-unrolled", "--iterations", "1"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "averages 2 clients' updates" in err and "--method ig" in err


@pytest.mark.parametrize("batch_size", [1, 3])  # 3: an epoch of 4-5 samples ends short
def test_later_epochs_in_the_first_ones_order_are_a_guess_and_the_known_order_exact(
    tmp_path, batch_size
):
    """Two epochs of a client's few samples: the client reshuffled for the second, which the
    server cannot know; the replay of the truth then misses, and the attack says why. Given
    the client's shuffle (``known_order``: from the run's seed), the replay is exact."""
    folder = tiny_run(
        tmp_path,
        "num_clients=400",
        "local_steps=null",
        "local_epochs=2",
        f"batch_size={batch_size}",
    )
    cfg, up, model = first_update(folder)
    obs, err, found = unrolled_observation(cfg, up, model)
    assert [f.key for f in found] == ["local_epochs", "replay"]
    assert len(obs.unroll.trained) == 2 * obs.unroll.per_epoch and err is not None and err > 1e-3
    assert "--known-order" in found[1].line and "from the config" not in found[1].line  # why
    obs, err, found = unrolled_observation(cfg, up, model, known_order=True)
    assert [f.key for f in found] == ["--known-order"] and "upper bound" in found[0].line
    assert err is not None and err < 1e-5


def test_the_known_order_needs_the_unrolled_attack_one_line_exit_2(tmp_path, capsys):
    folder = tiny_run(tmp_path)
    assert main(["attack", str(folder), "--method", "ig", "--known-order"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--known-order" in err[0] and "--method ig-unrolled" in err[0]


def test_a_policy_configured_per_client_replays_its_sent_units_and_says_so(tmp_path):
    """CoCoFL trains one block a client, chosen by the server for its device (``client_config``,
    which the attack does not rebuild): the sent units at every step, exact for it."""
    from tiny import method_needs

    needs = [f"{k}={v}" for k, v in method_needs("cocofl").items() if k != "system"]
    folder = tiny_run(tmp_path, "policy=cocofl", "upload=partial", "system.abilities=uniform",
                      *needs)  # fmt: skip
    cfg, up, model = first_update(folder)
    obs, err, found = unrolled_observation(cfg, up, model)
    assert [f.key for f in found] == ["policy"] and "per-client config" in found[0].line
    assert err is not None and err < 1e-5


@pytest.mark.slow  # scoring imports scikit-image, SciPy and matplotlib: seconds
def test_the_attack_says_its_findings_first_and_its_progress_to_the_terminal_and_a_log(tmp_path):
    pytest.importorskip("skimage")
    from fedbug.attack import attack

    folder = tiny_run(tmp_path, "num_clients=400", "local_steps=null", "local_epochs=2")
    said: list[str] = []
    s = attack(folder, 1, None, "auto", 4, say=said.append)
    assert s["method"] == "ig-unrolled" and said[0].startswith("warn: local_epochs")
    steps = [line for line in said if line.startswith("iteration ")]
    assert [line.split(",")[0] for line in steps] == [f"iteration {i}/4" for i in (1, 2, 3, 4)]
    log = folder / "attack" / f"round-1-client-{s['client']}-ig-unrolled" / "attack.log"
    assert log.read_text().splitlines() == said
