"""Session 19's hostile drill of the trust boundaries (RELIABILITY.md, "Trust model"): a thinned
curve's declaration in a received run folder, and what a Hugging Face model folder named by a
received config may hold. Each case failed on the code before its fix."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from guards import at_most

from fedbug.cli import main
from fedbug.errors import ConfigError, FedbugError
from fedbug.results import record_crc, with_crc

# ---------------------------------------------------------------- a thinned curve's declaration


def _lying_thinned_run(folder: Path, rounds: int) -> Path:
    """A received run folder holding only a thinned curve whose declaration (checksum and all,
    a checksum is no signature) says ``rounds`` rounds, and a summary that agrees."""
    run = folder / "run"
    run.mkdir(parents=True)
    declared = {"of": "metrics.jsonl", "every": 1, "rounds": rounds, "sha256": "0" * 64}
    head = {"thinned": declared, "crc": record_crc({"thinned": declared})}
    (run / "metrics.thin.jsonl").write_text(json.dumps(head) + "\n")
    summary = {"config": {"name": "x"}, "seed": 0, "rounds": rounds, "seconds": 1.0}
    (run / "summary.json").write_text(json.dumps(with_crc(summary)))
    return run


def test_a_thinned_curve_declaring_more_rounds_than_a_run_may_have_is_damage(tmp_path, capsys):
    """A 200-byte declaration of 10^15 rounds made the reader list every round it declares
    before reading a line: ``fedbug report`` was a ``MemoryError`` traceback (exit 1), and
    10^8 rounds took 4 GB and 3.7 s, 10^9 forty. Now a declaration past the 1,000,000 rounds a
    config may ask for is damage: one warning naming the file and 'rounds', exit 2."""
    run = _lying_thinned_run(tmp_path / "received", 10**15)
    assert main(["report", str(tmp_path / "received")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err  # the skipped run's warning, then "no finished runs"
    assert str(run / "metrics.thin.jsonl") in err[0] and "'rounds' is 1000000000000000" in err[0]


# ---------------------------------------------------------------- a Hugging Face model folder

V, T = 12, 8  # the tiny causal LM's vocabulary and sequence length


class _RunsCode:
    """Unpickled, it would touch ``path`` (what a planted pickle does)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.path}",))


def _model_folder(folder: Path) -> Path:
    """A tiny GPT-2 saved as transformers saves one: config.json and model.safetensors."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, n_positions=T, vocab_size=V)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    return folder


def _pickled_weights(folder: Path, marker: Path) -> None:
    """The weights as a pickle (``pytorch_model.bin``) that names ``os.system``."""
    from safetensors.torch import load_file

    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save({"planted": _RunsCode(marker), **weights}, folder / "pytorch_model.bin")


def _cut_weights(folder: Path, marker: Path) -> None:
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])


def _config_not_json(folder: Path, marker: Path) -> None:
    (folder / "config.json").write_text("{not json")


#: a received model folder's damage, with what the refusal names
FOLDERS = {
    "weights a pickle naming os.system": (_pickled_weights, "holds objects other than tensors"),
    "weights cut short": (_cut_weights, "model.safetensors"),
    "config.json not JSON": (_config_not_json, "config.json"),
}


@pytest.mark.parametrize("damage", sorted(FOLDERS))
def test_a_received_model_folder_that_cannot_be_loaded_is_one_line(tmp_path, damage):
    """``model: hf:FOLDER`` (a received config, and what ``fedbug attack`` builds from a
    recorded update) on a folder whose weights are a pickle naming ``os.system`` was torch's
    ``UnpicklingError`` traceback advising ``weights_only=False``; whose model.safetensors is
    cut short, a ``SafetensorError`` traceback; whose config.json is not JSON, "no model folder
    at FOLDER" (the folder is there). Now one line naming the folder and the problem; nothing
    in the pickle ran."""
    from fedbug.models import build_model

    folder, marker = _model_folder(tmp_path / "received-model"), tmp_path / "pwned"
    change, what = FOLDERS[damage]
    change(folder, marker)
    with pytest.raises(ConfigError) as e:
        build_model(f"hf:{folder}", (T,), V, 0, task="next_token")
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and str(folder) in msg and what in msg, msg
    assert "no model folder" not in msg and "weights_only" not in msg, msg
    assert not marker.exists()


KERNEL = "kernels-community/flash-attn"  # a kernel on the Hub: code fetched and run


def test_hf_config_cannot_name_a_kernel_on_the_hub(tmp_path, capsys):
    """``hf_config: {attn_implementation: kernels-community/flash-attn}`` made transformers
    fetch that repository's compiled code from the Hub and load it (where the ``kernels``
    package is installed; here an ``ImportError`` traceback, exit 1): a received config ran
    code from outside. Now one line naming the key, exit 2, ``--out`` empty."""
    pytest.importorskip("transformers")
    cfg = tmp_path / "received.yaml"
    gpt2 = {"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2, "n_positions": T}
    doc = {"dataset": "digits", "task": "next_token", "model": "hf", "rounds": 1,
           "hf_config": {**gpt2, "attn_implementation": KERNEL}}  # fmt: skip
    cfg.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    assert main(["run", str(cfg), "--out", str(out), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hf_config.attn_implementation" in err, err
    assert not out.exists() or not any(out.iterdir())
    from fedbug.models import build_model

    for value in (KERNEL, {"": KERNEL}):  # what a recorded update's options may hold too
        with pytest.raises(ConfigError, match="hf_config.attn_implementation"):
            build_model("hf", (T,), V, 0, task="next_token",
                        hf_config={**gpt2, "attn_implementation": value})  # fmt: skip


def test_a_model_folders_config_cannot_name_a_kernel_on_the_hub(tmp_path):
    """The same kernel named by a received model folder's config.json: one line naming the
    folder and the kernel; ``hf_config: {attn_implementation: sdpa}`` beside it loads it."""
    from fedbug.models import build_model

    folder = _model_folder(tmp_path / "received-model")
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, "attn_implementation": KERNEL}))
    with pytest.raises(ConfigError) as e:
        build_model(f"hf:{folder}", (T,), V, 0, task="next_token")
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and str(folder) in msg and KERNEL in msg, msg
    assert "config.json's attn_implementation" in msg and "sdpa" in msg, msg
    model = build_model(f"hf:{folder}", (T,), V, 0, task="next_token",
                        hf_config={"attn_implementation": "sdpa"})  # fmt: skip
    assert model.config._attn_implementation == "sdpa"


# ---------------------------------------------------------------- a FIFO in a file's place


@pytest.mark.parametrize("name", ["summary.json", "metrics.jsonl", "metrics.thin.jsonl"])
def test_report_on_a_received_folder_with_a_fifo_in_a_files_place(tmp_path, capsys, name):
    """A received run folder (a tar archive holds FIFOs and links) whose summary.json,
    metrics.jsonl or metrics.thin.jsonl is a FIFO: ``fedbug report`` blocked on it forever
    (and a link to /dev/zero read until the memory ran out: a ``MemoryError`` traceback).
    Now the run is skipped with one warning naming the file, exit 2, within the second."""
    run = _lying_thinned_run(tmp_path / "received", 3)
    if name != "metrics.thin.jsonl":  # a full curve is read where there is one
        (run / "metrics.thin.jsonl").unlink()
        (run / "metrics.jsonl").write_text("")
    (run / name).unlink()
    os.mkfifo(run / name)
    with at_most(5):
        assert main(["report", str(tmp_path / "received")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and str(run / name) in err[0] and "not a regular file" in err[0], err


def test_recorded_updates_and_checkpoints_that_are_fifos_are_one_line(tmp_path):
    """What ``fedbug attack`` and ``fedbug run --resume`` read from a received folder: a FIFO
    in place of a recorded update's JSON or tensors, or of the checkpoint, blocked forever."""
    from fedbug.results.checkpoint import load_checkpoint_file
    from fedbug.results.updates import load_tensors, read_meta

    for name in ("client-0.json", "client-0.pt", "checkpoint.pt"):
        os.mkfifo(tmp_path / name)
    with at_most(5):
        for read in (
            lambda: read_meta(tmp_path / "client-0.json"),
            lambda: load_tensors(tmp_path, tmp_path / "client-0.pt"),
            lambda: load_checkpoint_file(tmp_path / "checkpoint.pt"),
        ):
            with pytest.raises(FedbugError, match="not a regular file") as e:
                read()
            assert len(str(e.value).splitlines()) == 1


def test_a_fifo_beside_a_received_run_is_not_waited_on(tmp_path, capsys):
    """A FIFO for the sweep.json beside a received run (read to name the report's cells) or
    for the full curve beside its thinned one (``python -m fedbug.report.thin --check``
    compares the two): both blocked forever. Now the report reads the run without the sweep's
    names, and the check refuses the FIFO in one line."""
    from fedbug.report.thin import main as thin_main

    run = _lying_thinned_run(tmp_path / "received", 0)
    os.mkfifo(tmp_path / "received" / "sweep.json")
    with at_most(5):
        assert main(["report", str(tmp_path / "received")]) == 0
        assert capsys.readouterr().err == ""
        os.mkfifo(run / "metrics.jsonl")
        assert thin_main([str(run), "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "metrics.jsonl' is not a regular file" in err[0], err
