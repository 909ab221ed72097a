"""``fedbug cost``: FreezeFL Fig. 2 and FedSeq Table 6, computed without loading data.

The FedSeq numbers are the paper's (Sec. 5.2: 873.039 / 865.344 / 314.912 / 838.880 billion)
and what torch.utils.flop_counter counts for FedSeq's CNN on a batch of 10 (torch 2.13)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

from fedbug.config import load_config
from fedbug.core.flops import FlopCache, training_flops
from fedbug.core.units import ParamSpace, find_units
from fedbug.errors import ConfigError
from fedbug.policies.schedule import RoundSchedule
from fedbug.report.cost import cost_report, format_cost_report, round_phases
from fedbug.system import freeze_rows

ROOT = Path(__file__).parent.parent
FEDSEQ = ROOT / "configs" / "paper" / "fedseq-cost.yaml"
SMALL = {
    "dataset": "digits",
    "model": "digits_cnn",
    "num_clients": 10,
    "clients_per_round": 2,
    "rounds": 6,
    "local_epochs": 1,
    "batch_size": 10,
}


@pytest.fixture(scope="module")
def fedseq() -> dict:
    return cost_report(load_config(FEDSEQ))


def _write(tmp_path: Path, doc: dict) -> str:
    path = tmp_path / "cost.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_fedseq_table6_proxy_matches_the_paper(fedseq):
    m = fedseq["methods"]
    assert [[ph["params"] for ph in m[k]["phases"]] for k in m] == [
        [582_026],
        [576_896],
        [832, 52_096, 576_896],
        [524_800, 576_064, 576_896],
        [587_156],
    ]
    assert {k: v["paper_flops"] for k, v in m.items()} == {
        "fedavg": 873_039_000_000,
        "fedbabu": 865_344_000_000,
        "fedseq-vanilla": 314_912_000_000,
        "fedseq-anti": 838_880_000_000,
        "fedrod": 880_734_000_000,  # the model and the personal head (5,130)
    }
    assert m["fedavg"]["upload_params"] == 174_607_800
    assert m["fedseq-vanilla"]["upload_params"] == 62_982_400
    assert [ph["rounds"] for ph in m["fedseq-anti"]["phases"]] == [[1, 100], [101, 200], [201, 300]]
    assert [ph["units"] for ph in m["fedseq-vanilla"]["phases"]] == [
        ["conv1"],
        ["conv1", "conv2"],
        ["conv1", "conv2", "fc1"],
    ]


def test_fedseq_measured_flops_reverse_the_proxy(fedseq):
    m = fedseq["methods"]
    per = {k: [ph["flops_batch"] for ph in v["phases"]] for k, v in m.items()}
    assert per["fedavg"] == [246_804_480]
    # FedROD through its own class (model wrapped with the personal head, the balanced softmax
    # on the batch's class counts): the same count as the plain cross-entropy copy it replaced,
    # as the counter counts matmuls and convolutions and the balanced softmax adds none. The
    # personal head (512 -> 10) adds its forward and weight gradient on a batch of 10.
    assert per["fedrod"] == [246_804_480 + 2 * (2 * 10 * 512 * 10)]
    assert m["fedrod"]["phases"][0]["units"][-2:] == ["model.fc2", "personal_head"]
    assert m["fedrod"]["upload_params"] == m["fedavg"]["upload_params"]  # not the personal head
    assert per["fedseq-vanilla"] == [170_680_320, 236_216_320, 246_702_080]
    assert per["fedseq-anti"] == [95_928_320, 171_950_080, 246_702_080]
    # 300 rounds x 50 batches x 100 clients, 100 rounds a phase
    assert m["fedavg"]["flops"] == 246_804_480 * 300 * 50 * 100
    assert m["fedseq-anti"]["flops"] == sum(per["fedseq-anti"]) * 100 * 50 * 100
    ratio = {k: v["flops"] / m["fedavg"]["flops"] for k, v in m.items()}
    proxy = {k: v["paper_flops"] / m["fedavg"]["paper_flops"] for k, v in m.items()}
    assert round(ratio["fedseq-anti"], 3) == 0.695 and round(ratio["fedseq-vanilla"], 3) == 0.883
    assert round(proxy["fedseq-vanilla"], 3) == 0.361 and round(proxy["fedseq-anti"], 3) == 0.961
    text = format_cost_report(fedseq)
    for s in ["873.039 billion", "314.912 billion", "838.880 billion", "880.734 billion",
              "832 / 52,096 / 576,896", "174,607,800", "62,982,400", "246,804,480",
              "reversing the parameter proxy", "0.695x", "0.883x", "0.361x", "0.961x"]:  # fmt: skip
        assert s in text


def test_fedseq_fig2_rows(fedseq):
    rows = fedseq["rows"]
    assert [r["n_frozen"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["compute_ratio"] == 1.0 and rows[0]["comm_ratio"] == 1.0
    # conv1 frozen: conv2, fc1 and the head train (backward stops at conv2's input)
    assert rows[1]["flops_sample"] * 10 == 172_052_480
    assert rows[1]["compute_ratio"] == 172_052_480 / 246_804_480
    assert rows[3]["upload_bytes"] == 4 * 5_130
    assert rows[3]["comm_ratio"] == pytest.approx(5_130 / 582_026)


def test_fig2_rows_on_two_linear_layers_by_hand():
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    b = 5
    x, y = torch.randn(b, 4), torch.tensor([0, 1, 0, 1, 1])
    units = find_units(model, x)
    space = ParamSpace(model, units)
    cache = FlopCache(model, _ce)
    rows = freeze_rows(units, space, lambda trained: cache.units(units, trained, x, y), b)
    # a matmul of (m x k)(k x n) is 2mkn FLOPs; bias adds are not counted.
    forward = 2 * 4 * 3 + 2 * 3 * 2  # a sample
    # layer 2: weight grad and input grad; layer 1: weight grad only (x needs no grad)
    full = forward + 2 * 3 * 2 + 2 * 2 * 3 + 2 * 4 * 3
    head_only = forward + 2 * 3 * 2
    assert [r["flops_sample"] for r in rows] == [full, head_only]
    assert [r["compute_ratio"] for r in rows] == [1.0, head_only / full]
    assert [r["upload_bytes"] for r in rows] == [4 * (15 + 8), 4 * 8]
    assert rows[1]["comm_ratio"] == 8 / 23
    assert rows[1]["frozen"] == ["0"]


def _ce(out, y):
    return nn.functional.cross_entropy(out, y)


def test_lstm_flops_are_counted():
    """oneDNN's fused CPU LSTM is invisible to the counter; training_flops turns it off."""
    model = nn.Sequential(nn.Embedding(5, 2))
    lstm = nn.LSTM(2, 3, batch_first=True)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.lstm, self.fc = model[0], lstm, nn.Linear(3, 5)

        def forward(self, x):
            return self.fc(self.lstm(self.emb(x))[0][:, -1])

    net = Net()
    x, y = torch.randint(0, 5, (4, 6)), torch.randint(0, 5, (4,))
    names = [n for n, _ in net.named_parameters()]
    all_flops = training_flops(net, names, x, y, _ce)
    fc_only = training_flops(net, ["fc.weight", "fc.bias"], x, y, _ce)
    assert fc_only > 2 * (2 * 4 * 3 * 5)  # more than fc's forward and weight grad: the LSTM's
    assert all_flops > fc_only


def test_round_phases_follow_the_schedule_t_k_below_t():
    subs = [(0,), (1,), (2,)]
    vanilla = RoundSchedule.build("vanilla", subs, 300, (0, 100, 200))
    assert round_phases(vanilla.round_units, 300) == [
        (1, 100, (0,)),
        (101, 200, (0, 1)),
        (201, 300, (0, 1, 2)),
    ]
    anti = RoundSchedule.build("anti", subs, 3, (0, 0, 2))
    assert round_phases(anti.round_units, 3) == [(1, 2, (1, 2)), (3, 3, (0, 1, 2))]


def test_fedrod_units_and_sublayers_named_as_the_model_names_them(tmp_path):
    """A config names the model's submodules; FedROD's wrapped model finds them as model.*."""
    doc = {**SMALL, "units": [["conv1"], "conv2", "fc1", "fc2", "fc3"]}
    doc["sublayers"] = [["conv1", "conv2"], ["fc1", "fc2"]]
    report = cost_report(load_config(_write(tmp_path, doc)), samples_per_client=40)
    assert report["setting"]["sublayers"] == [["conv1", "conv2"], ["fc1", "fc2"]]
    (phase,) = report["methods"]["fedrod"]["phases"]
    assert phase["units"] == [
        "model.conv1",
        "model.conv2",
        "model.fc1",
        "model.fc2",
        "model.fc3",
        "personal_head",
    ]
    assert [ph["units"] for ph in report["methods"]["fedseq-anti"]["phases"]] == [
        ["fc1", "fc2"],
        ["conv1", "conv2", "fc1", "fc2"],
    ]


def test_cli_json_shape_participants_and_plot(tmp_path, capsys):
    from fedbug.cli import main

    cfg = _write(tmp_path, SMALL)
    assert main(["cost", cfg, "--json", "--samples-per-client", "40"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert set(every) >= {"rows", "methods"}
    assert list(every["methods"]) == [
        "fedavg",
        "fedbabu",
        "fedseq-vanilla",
        "fedseq-anti",
        "fedrod",
    ]
    for m in every["methods"].values():
        assert set(m) == {"paper_flops", "flops", "upload_params", "peak_mem", "phases"}
    assert len(every["rows"]) == 5  # digits_cnn's units
    assert set(every["rows"][0]) >= {"n_frozen", "compute_ratio", "comm_ratio"}
    fedavg = every["methods"]["fedavg"]
    assert fedavg["paper_flops"] == 17_866 * 6 * 4 * 10  # params x rounds x batches x clients
    out = tmp_path / "out"
    assert main(["cost", cfg, "--json", "--samples-per-client", "40", "--participants",
                 "--out", str(out)]) == 0  # fmt: skip
    some = json.loads(capsys.readouterr().out)
    for k, m in some["methods"].items():  # 2 of 10 clients a round
        assert m["paper_flops"] * 5 == every["methods"][k]["paper_flops"]
        assert m["upload_params"] == round(every["methods"][k]["upload_params"] / 5)
    assert (out / "cost.png").stat().st_size > 1000
    assert json.loads((out / "cost.json").read_text()) == some


@pytest.mark.parametrize(
    "doc, needle",
    [
        ({**SMALL, "lrr": 0.1}, "unknown key 'lrr'"),
        ({**SMALL, "unfreeze_rounds": [0, 2]}, "unfreeze_rounds has 2 entries"),
        ({**SMALL, "unfreeze_rounds": [0, 2, 6, 7]}, "only 6 rounds"),
        ({**SMALL, "head_units": 5}, "keeps a head of 5 unit(s)"),  # as a run says
        ({**SMALL, "model": "fedseq_cnn"}, "cannot be built"),
    ],
)
def test_cli_bad_config_is_one_line_and_exit_2(tmp_path, capsys, doc, needle):
    from fedbug.cli import main

    assert main(["cost", _write(tmp_path, doc)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedbug: error:") and needle in err


def test_cli_missing_file_exit_2(tmp_path, capsys):
    from fedbug.cli import main

    assert main(["cost", str(tmp_path / "nope.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_a_causal_lm_on_every_position_counts_its_head_there_and_leaves_fedrod_out():
    """targets: every: the example batch holds a target at every position, so the output layer
    counts on every position (more FLOPs than the last position's); FedROD, which this config
    cannot run (next_token), is left out with its reason instead of failing."""
    pytest.importorskip("transformers")
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 8, "n_head": 2, "n_positions": 80}
    doc = dict(dataset="shakespeare", task="next_token", model="hf", hf_config=gpt2,
               units="blocks", rounds=4, local_steps=1, batch_size=4)  # fmt: skip
    last = cost_report(load_config(None, doc=doc))
    every = cost_report(load_config(None, doc={**doc, "targets": "every"}))
    assert set(every["left_out"]) == {"fedrod"} and "fedrod" not in every["methods"]
    assert every["setting"]["flops_batch_full"] > last["setting"]["flops_batch_full"]
    assert "not counted: FedROD" in format_cost_report(every)


def test_targets_every_on_a_model_scoring_one_position_is_one_line():
    doc = dict(dataset="shakespeare", task="next_token", model="shakespeare_lstm",
               targets="every", rounds=2, local_steps=1, batch_size=4)  # fmt: skip
    with pytest.raises(ConfigError, match=r"one score row a sequence.*targets: last"):
        cost_report(load_config(None, doc=doc))


def test_each_methods_local_steps_are_its_sessions_count():
    """The local steps of a round come from the algorithm's client session, as a run counts
    them (``local_step_count`` with the run's ``train_settings``): FedRep's head epochs come
    before its E epochs of the base, so with 2 head epochs, E = 1 and 40 samples in batches of
    10 a client takes 3 x 4 = 12 steps, where the config's own E x ceil(n/B) says 4."""
    from fedbug.report.cost import _build, _model_and_example, _setting

    doc = {**SMALL, "algorithm": "fedrep", "fedrep": {"head_epochs": 2}}
    cfg = load_config(None, doc={**doc, "evaluation": "personalized"})
    s = _setting(cfg, 40, False)
    model, x, y = _model_and_example(cfg, s)
    fedrep = _build(cfg, "fedrep", model, x, y, s)
    assert (fedrep.steps, fedrep.per_epoch) == (12, 4)
    fedavg = _build(cfg, "fedavg", model, x, y, s)
    assert (fedavg.steps, fedavg.per_epoch) == (4, 4)
    assert cost_report(cfg, 40)["setting"]["local_steps"] == 4  # the table's methods: FedAvg's


def test_synthetic_is_counted_from_its_declared_shape():
    """``synthetic`` (60 features, 10 classes, any dataset_options) had no entry in cost's own
    table of shapes; it now reads the data registry's declaration."""
    doc = {**SMALL, "dataset": "synthetic", "model": "mlp", "model_options": {"hidden": [8]}}
    report = cost_report(load_config(None, doc={**doc, "dataset_options": {"alpha": 0.5}}), 40)
    st = report["setting"]
    assert st["input_shape"] == [60] and st["num_classes"] == 10
    assert st["params"] == 60 * 8 + 8 + 8 * 10 + 10
    forward = 2 * 60 * 8 + 2 * 8 * 10  # a sample; the input needs no gradient
    assert st["flops_batch_full"] == 10 * (forward + 2 * 8 * 10 + 2 * 10 * 8 + 2 * 60 * 8)


def test_dataset_options_a_data_set_does_not_take_are_refused_as_a_run_refuses_them():
    cfg = load_config(None, doc={**SMALL, "dataset_options": {"alpha": 0.5}})
    with pytest.raises(ConfigError, match="'digits' takes no dataset_options"):
        cost_report(cfg)


def test_fig2_is_the_system_models_count():
    """Fig. 2's FLOPs a sample are the system model's (``system: {cost: flops}``): the engine
    counts them on a 2-sample example, cost on a batch of B, both with the session's loss
    (:func:`~fedbug.engine.counting.counting_loss`); the count is per sample, so they agree."""
    from fedbug.algorithms import build_algorithm
    from fedbug.engine.build import build_parts
    from fedbug.engine.counting import counting_loss
    from fedbug.models import build_model
    from fedbug.system import count_per_sample_flops

    report = cost_report(load_config(None, doc=SMALL), 40)
    model = build_model("digits_cnn", (1, 8, 8), 10, 0)
    alg = build_algorithm("fedavg", 1.0, {})
    x, y = torch.rand(2, 1, 8, 8), torch.tensor([3, 7])
    parts = build_parts(load_config(None, doc=SMALL), alg, model, x[:1])
    loss = counting_loss(load_config(None, doc=SMALL), alg, y, 40)
    engine = count_per_sample_flops(parts.template, parts.units, x, y, loss)
    assert [r["flops_sample"] for r in report["rows"]] == engine


def test_a_one_unit_model_leaves_out_the_methods_that_need_a_head_and_prints_the_rest():
    """logreg has one unit: FedBABU (and FedSeq's sub-layers, FedROD) need a head apart from
    the base; each such row is left out with its reason, Fig. 2 and FedAvg are still counted."""
    doc = {**SMALL, "dataset": "synthetic", "model": "logreg"}
    report = cost_report(load_config(None, doc=doc), 40)
    assert "fedavg" in report["methods"] and "fedbabu" in report["left_out"]
    assert "keeps a head of 1 unit(s)" in report["left_out"]["fedbabu"]
    assert report["methods"]["fedavg"]["paper_flops"] == (60 * 10 + 10) * 4 * 6 * 10
    assert [r["n_frozen"] for r in report["rows"]] == [0]
    text = format_cost_report(report)
    assert "FreezeFL Fig. 2" in text and "not counted: FedBABU, which" in text


def test_the_configs_own_method_is_the_first_row_counted_by_its_session():
    """FedRep (1 head epoch, E = 1, 50 batches of 10 an epoch, 6 rounds, all 10 clients): 50
    steps train the head fc3 (650 parameters), then 50 the base conv1..fc2 (17,216); only the
    base is uploaded."""
    doc = {**SMALL, "method": "fedrep", "evaluation": "personalized"}
    report = cost_report(load_config(None, doc=doc))
    assert list(report["methods"])[:2] == ["fedrep", "fedavg"]
    m = report["methods"]["fedrep"]
    assert [(ph["steps"], ph["units"]) for ph in m["phases"]] == [
        ([1, 50], ["fc3"]),
        ([51, 100], ["conv1", "conv2", "fc1", "fc2"]),
    ]
    assert m["paper_flops"] == (650 * 50 + 17_216 * 50) * 6 * 10
    assert m["upload_params"] == 17_216 * 6
    fedavg = report["methods"]["fedavg"]["phases"][0]
    assert m["phases"][1]["flops_batch"] < fedavg["flops_batch"]
    assert m["flops"] == 6 * 10 * 50 * sum(ph["flops_batch"] for ph in m["phases"])
    assert "\nfedrep " in format_cost_report(report)


def test_fedbug_is_its_own_row_unfreezing_step_by_step():
    """FedBug (bottom_up, gu_ratio 0.5, 5 units, 50 steps): the first 25 steps unfreeze one
    unit more every 5 steps from the input side (conv1: 160 parameters, conv2 4,640, fc1 8,256,
    fc2 4,160, fc3 650), then the whole model trains; a round uploads every unit."""
    doc = {**SMALL, "policy": "bottom_up", "bottom_up": {"gu_ratio": 0.5}}
    report = cost_report(load_config(None, doc=doc))
    name = list(report["methods"])[0]
    assert name == "fedavg+bottom_up"
    phases = report["methods"][name]["phases"]
    assert [ph["units"][-1] for ph in phases] == ["conv1", "conv2", "fc1", "fc2", "fc3"]
    assert [ph["steps"] for ph in phases] == [[1, 5], [6, 10], [11, 15], [16, 20], [21, 50]]
    params = [160, 4_800, 13_056, 17_216, 17_866]
    assert report["methods"][name]["paper_flops"] == sum(
        p * (b - a + 1) * 6 * 10 for p, (a, b) in zip(params, [ph["steps"] for ph in phases])
    )
    assert report["methods"][name]["upload_params"] == 17_866 * 6


def test_a_config_running_a_row_adds_no_row(fedseq):
    """fedseq-cost.yaml runs FedAvg, already a row; so is FedSeq vanilla (FedBABU's algorithm
    under the schedule); FedAvg under the schedule is not, and is the first row."""
    assert list(fedseq["methods"])[0] == "fedavg" and len(fedseq["methods"]) == 5
    preset = cost_report(load_config(None, doc={**SMALL, "method": "fedseq-vanilla"}), 40)
    assert list(preset["methods"]) == list(fedseq["methods"])
    own = cost_report(load_config(None, doc={**SMALL, "schedule": "vanilla"}), 40)
    assert list(own["methods"]) == ["fedavg+vanilla", *fedseq["methods"]]


def test_table6_columns_line_up_and_the_upload_column_says_it_is_a_runs_total(fedseq):
    lines = format_cost_report(fedseq).split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith("method "))
    table = lines[start : lines.index("", start)]
    assert "over the run" in table[0]
    assert len({len(line) for line in table}) == 1, table  # the last column right-aligned


def test_cost_help_says_what_its_options_are():
    from fedbug.cli import build_parser

    sub = next(a for a in build_parser()._actions if hasattr(a, "choices") and a.choices)
    helps = {
        cmd: {o: a.help for a in sub.choices[cmd]._actions for o in a.option_strings}
        for cmd in ("run", "sweep", "repair", "cost", "attack")
    }
    assert "sample" in helps["cost"]["--samples-per-client"]
    assert "participation" in helps["cost"]["--participants"]
    assert "--jobs" in helps["sweep"]["--import"] and "--jobs" in helps["run"]["--import"]
    for cmd in ("repair", "cost", "attack"):
        assert "--jobs" not in helps[cmd]["--import"] and "--ray" not in helps[cmd]["--import"]
    assert "executor: processes" in helps["repair"]["--import"]


def test_under_full_upload_a_round_uploads_every_shared_unit():
    """``upload: full``: FedSeq's rounds upload the whole shared base (as FedBABU's do), not
    only the sub-layers they train (it counted partial uploads whatever the config said)."""
    part = cost_report(load_config(None, doc=SMALL))["methods"]
    full = cost_report(load_config(None, doc={**SMALL, "upload": "full"}))["methods"]
    assert part["fedseq-vanilla"]["upload_params"] < part["fedbabu"]["upload_params"]
    for name in ("fedseq-vanilla", "fedseq-anti", "fedbabu"):
        assert full[name]["upload_params"] == full["fedbabu"]["upload_params"]
    assert full["fedavg"]["upload_params"] == part["fedavg"]["upload_params"]
