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
