"""Session 18's hostile drill of the trust boundaries (RELIABILITY.md, "Trust model") on what
landed after the trust drills: a Hugging Face model's ``hf_config`` (``trust_remote_code``), the
``-s method=NAME`` override, ``fedbug attack``'s recorded updates, and the benchmarks' readers
of committed run folders (the family extract, the privacy study). Each case failed on the code
before its fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fedbug.cli import main
from fedbug.errors import ConfigError

# ---------------------------------------------------------------- a model's own code


def _remote_code_folder(tmp_path: Path) -> tuple[Path, Path]:
    """A model folder whose config.json maps AutoConfig to its own Python file, which touches a
    marker when imported (what ``trust_remote_code`` would run)."""
    marker = tmp_path / "pwned"
    folder = tmp_path / "received-model"
    folder.mkdir()
    auto_map = {"AutoConfig": "configuration_evil.EvilConfig"}
    (folder / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": auto_map}))
    (folder / "configuration_evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "from transformers import PretrainedConfig\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n"
    )
    return folder, marker


def test_hf_config_cannot_turn_on_a_models_own_code(tmp_path, capsys):
    """``hf_config: {trust_remote_code: true}`` beside ``model: hf:FOLDER`` was passed to
    transformers' ``AutoConfig.from_pretrained``, which imported the folder's Python file: a
    received config ran code. Now one line, exit 2, nothing run, ``--out`` empty."""
    pytest.importorskip("transformers")
    folder, marker = _remote_code_folder(tmp_path)
    cfg = tmp_path / "received.yaml"
    doc = {"dataset": "shakespeare", "task": "next_token", "model": f"hf:{folder}",
           "hf_config": {"trust_remote_code": True}, "rounds": 1}  # fmt: skip
    cfg.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert not marker.exists()
    assert len(err.splitlines()) == 1 and "hf_config.trust_remote_code" in err
    assert not out.exists() or not any(out.iterdir())


def test_a_recorded_models_hf_config_cannot_turn_it_on_either(tmp_path):
    """What ``fedbug attack`` and every worker call: ``build_model`` with the options a file
    names (a recorded update's ``model_options``)."""
    pytest.importorskip("transformers")
    from fedbug.models import build_model

    folder, marker = _remote_code_folder(tmp_path)
    with pytest.raises(ConfigError, match="trust_remote_code"):
        build_model(f"hf:{folder}", (8,), 80, 0, task="next_token",
                    hf_config={"trust_remote_code": True})  # fmt: skip
    assert not marker.exists()


# ---------------------------------------------------------------- -s method=NAME


@pytest.mark.parametrize("value", ["policy=[1]", "selection={a: 1}", "algorithm=[fedavg]"])
def test_method_override_beside_a_value_that_is_not_a_name_is_one_line(tmp_path, capsys, value):
    """``-s method=slt -s policy=[1]`` was a ``TypeError: unhashable type`` traceback (exit 1)
    from the method's replacement of the file's keys; now the key's own one-line refusal."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("dataset: digits\nrounds: 1\n")
    out = tmp_path / "out"
    assert main(["run", str(cfg), "-s", "method=slt", "-s", value, "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fedbug: error: ")
    assert f"{value.split('=')[0]}: " in err and "Traceback" not in err
    assert not out.exists()


# ---------------------------------------------------------------- fedbug attack's recorded files


# recorded_run (a one-round run that recorded its updates): tests/reliability/conftest.py


def _doctored(run: Path, tmp_path: Path, change) -> tuple[Path, Path]:
    """A copy of ``run`` whose first recorded client's JSON side ``change`` rewrote."""
    import shutil

    copy = tmp_path / "received-run"
    shutil.copytree(run, copy)
    meta = sorted((copy / "updates" / "round-1").glob("client-*.json"))[0]
    doc = json.loads(meta.read_text())
    new = change(doc)
    meta.write_text(new if isinstance(new, str) else json.dumps(new))
    return copy, meta


CHANGES = {
    "not JSON": lambda d: "{not json",
    "a list": lambda d: "[1, 2]",
    "no model": lambda d: {k: v for k, v in d.items() if k != "model"},
    "lr a word": lambda d: {**d, "lr": "x"},
    "10^12 images": lambda d: {**d, "num_images": 10**12},
    "10^12 classes": lambda d: {**d, "num_classes": 10**12},
    "a name of no layer": lambda d: {**d, "received_names": {"nope": [0, 5]}},
    "a size past the weights": lambda d: {
        **d,
        "received_names": {**d["received_names"], "classifier.bias": [10**9, 10]},
    },
    "a pair that is a number": lambda d: {**d, "received_names": {"classifier.bias": 5}},
}


@pytest.mark.parametrize("what", list(CHANGES))
def test_attack_on_a_doctored_recorded_update_is_one_line(recorded_run, tmp_path, capsys, what):
    """A received run folder's ``updates/round-1/client-K.json`` damaged or edited: each was a
    traceback (JSONDecodeError, TypeError, KeyError, ValueError; 10^12 images asked torch for
    256 TB), or ran on; now one line naming the file or the key, exit 2, no attack folder."""
    run, meta = _doctored(recorded_run, tmp_path, CHANGES[what])
    k = meta.stem.split("-")[1]
    argv = ["attack", str(run), "--client", k, "--method", "dlg", "--iterations", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedbug: error:"), err
    assert "record the round again" in err[0]
    assert not (run / "attack").exists()


def test_recorded_weights_that_are_not_a_flat_tensor_are_one_line(recorded_run, tmp_path, capsys):
    import torch

    run, meta = _doctored(recorded_run, tmp_path, lambda d: d)
    torch.save({"other": torch.zeros(3)}, run / "updates" / "round-1" / "global.pt")
    argv = ["attack", str(run), "--client", meta.stem.split("-")[1], "--iterations", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "global.pt is not a round's recorded weights" in err[0]


# ---------------------------------------------------------------- benchmarks reading committed runs


def _outside_file(tmp_path: Path) -> Path:
    outside = tmp_path / "outside" / "bashrc"
    outside.parent.mkdir()
    outside.write_text("the user's own file\n")
    return outside


def test_privacy_json_is_never_written_through_a_link(tmp_path):
    """``python -m benchmarks.privacy.run attack`` writes ``privacy.json`` beside each finished
    run of a results folder that git keeps: a committed ``privacy.json`` that is a link (git
    clones links) had the outside file overwritten. Now the link is replaced, not followed."""
    from benchmarks.privacy.run import write_privacy

    outside = _outside_file(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"dp": {"epsilon": 1.5, "delta": 1e-5}}))
    (run / "privacy.json").symlink_to(outside)
    write_privacy(run)
    assert outside.read_text() == "the user's own file\n"
    assert not (run / "privacy.json").is_symlink()
    assert json.loads((run / "privacy.json").read_text()) == {"epsilon": 1.5, "delta": 1e-5}


def test_a_refused_attacks_record_is_never_written_through_a_link(tmp_path, monkeypatch):
    """The privacy study records a refused attack in ``RUN/attack/<name>-refused/scores.json``;
    a run's ``attack`` that is a link to an outside folder had the record made there."""
    import benchmarks.privacy.run as privacy
    from fedbug.errors import LinkRefused

    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    (run / "updates" / "round-3").mkdir(parents=True)
    (run / "updates" / "round-3" / "client-7.json").write_text("{}")
    (run / "attack").symlink_to(outside)

    def refused(*args):
        raise ConfigError("cannot replay this update exactly")

    monkeypatch.setattr(privacy, "_attack", refused)
    job = privacy.Job(str(run), 3, False, tuple(privacy.ITERATIONS.items()), "ig")
    with pytest.raises(LinkRefused):
        privacy.one_attack(job)
    assert not any(outside.iterdir())


def test_the_family_extract_never_writes_into_a_linked_run_folder(recorded_run, tmp_path):
    """``python -m benchmarks.family.report --extract`` writes ``family.json`` beside every
    finished run of a committed results folder: a run folder that is a link (to another folder
    holding a summary.json) had family.json written there. Now refused before any is written."""
    import shutil

    from benchmarks.family.report import extract
    from fedbug.config.loading import read_config_doc
    from fedbug.errors import LinkRefused
    from fedbug.sweeps.sweep import cell_runs

    outside = tmp_path / "outside-run"
    shutil.copytree(recorded_run, outside)
    config = tmp_path / "w.yaml"
    config.write_text(yaml.safe_dump({"name": "w", "dataset": "digits", "model": "mlp"}))
    results = tmp_path / "results"
    [(_, _, [cell])] = cell_runs(read_config_doc(config), results / "w-sweep")
    cell.parent.mkdir(parents=True)
    cell.symlink_to(outside)
    with pytest.raises(LinkRefused):
        extract(config, results)
    assert not (outside / "family.json").exists()
