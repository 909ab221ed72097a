"""A model's size from a config (RELIABILITY.md, "Input limits"): a config from someone else may
not stall the build or ask for more memory than the person who starts fedbug allows. Counts in
``hf_config`` are whole numbers of at least 1 and at most 1,000 blocks; every model built from
a config is counted on the meta device before it is built, and one over ``FEDBUG_MAX_PARAMS``
(default 2,000,000,000) is one line, exit 2, nothing written. Each case failed on the code before
the fix (the first hung: 10^5 GPT-2 blocks did not finish building in 60 s)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from fedbug.cli import main
from fedbug.config import load_config
from fedbug.core.seeding import derive_seed
from fedbug.errors import ConfigError
from fedbug.models import MLP, MODELS, build_model
from fedbug.models import size as model_size

GPT2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 8, "n_head": 2, "n_positions": 8}
#: the default MLP on digits (64 inputs, 10 classes): 64*64+64 + 64*32+32 + 32*10+10
MLP_DIGITS = 6_570


def _run(tmp_path: Path, doc: dict[str, Any], capsys: Any) -> tuple[int, list[str], Path, float]:
    """``fedbug run`` of ``doc`` on digits: exit code, stderr lines, the --out folder, seconds."""
    cfg = tmp_path / "c.yaml"
    base = dict(dataset="digits", num_clients=4, clients_per_round=2, rounds=1, threads=1)
    cfg.write_text(yaml.safe_dump({**base, **doc}))
    out = tmp_path / "out"
    start = time.perf_counter()
    rc = main(["run", str(cfg), "--out", str(out), "-q"])
    seconds = time.perf_counter() - start
    return rc, capsys.readouterr().err.strip().splitlines(), out, seconds


def _empty(folder: Path) -> bool:
    return not folder.exists() or not any(folder.iterdir())


# ---------------------------------------------------------------- counts in hf_config


def test_a_hundred_thousand_blocks_are_refused_fast_in_one_line(tmp_path, capsys):
    """The drill: ``n_layer: 100000`` did not finish building in 60 s (10^8 would run out of
    memory). Now one line at once naming the key, the limit and the fix; nothing written."""
    pytest.importorskip("transformers")
    doc = {"model": "hf", "task": "next_token", "hf_config": {**GPT2, "n_layer": 100_000}}
    rc, err, out, seconds = _run(tmp_path, doc, capsys)
    assert rc == 2 and len(err) == 1, err
    assert "hf_config.n_layer" in err[0] and "100000" in err[0] and "1,000" in err[0], err
    assert seconds < 2 and _empty(out)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("n_layer", -1),  # built a model with no blocks
        ("n_layer", 0),  # the same
        ("n_head", 0),  # a ZeroDivisionError traceback
        ("n_head", -2),  # built
        ("n_embd", 0),  # a ZeroDivisionError traceback
        ("vocab_size", 0),  # built, a vocabulary of no tokens
        ("n_positions", 0),  # built, no position to embed
        ("num_hidden_layers", True),  # huggingface_hub's validation traceback
        ("n_layer", 2.5),  # the same
    ],
)
def test_counts_that_are_not_a_positive_whole_number_are_one_line(key, value):
    doc = {"dataset": "digits", "model": "hf", "task": "next_token"}
    with pytest.raises(ConfigError, match=rf"hf_config\.{key}: .*at least 1.*{value}") as e:
        load_config(None, doc={**doc, "hf_config": {**GPT2, key: value}})
    assert "\n" not in str(e.value)
    # what worker processes, Flower nodes and fedbug attack call: the same refusal
    with pytest.raises(ConfigError, match=rf"hf_config\.{key}"):
        build_model("hf", (8,), 12, 0, hf_config={**GPT2, key: value}, task="next_token")


def test_a_count_in_a_sub_config_is_checked_too():
    doc = {"dataset": "digits", "model": "hf", "task": "next_token"}
    hf_config = {**GPT2, "text_config": {"num_hidden_layers": 5000}}
    with pytest.raises(ConfigError, match=r"hf_config\.text_config\.num_hidden_layers: 5000"):
        load_config(None, doc={**doc, "hf_config": hf_config})


def test_a_model_folders_own_config_json_is_bounded_too(tmp_path):
    """A received folder's config.json (no hf_config at all) declaring 10^5 blocks: one line
    naming the folder, before a block is built and without reading any weights."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "huge-gpt2"
    transformers.GPT2Config(n_layer=100_000, n_embd=8, n_head=2).save_pretrained(folder)
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"config\.json's n_layer: 100000 .*1,000") as e:
        build_model(f"hf:{folder}", (8,), 12, 0, task="next_token")
    assert str(folder) in str(e.value) and time.perf_counter() - start < 2


# ---------------------------------------------------------------- the parameter count


def test_a_billion_wide_mlp_is_refused_naming_the_count_and_the_variable(tmp_path, capsys):
    """``hidden: [10^9]`` on digits: 64*10^9 + 10^9 + 10*10^9 + 10 parameters (300 GB of
    float32); refused before anything is allocated, naming FEDBUG_MAX_PARAMS."""
    doc = {"model": "mlp", "model_options": {"hidden": [10**9]}}
    rc, err, out, seconds = _run(tmp_path, doc, capsys)
    assert rc == 2 and len(err) == 1, err
    assert "75,000,000,010 parameters" in err[0] and "2,000,000,000" in err[0], err
    assert "FEDBUG_MAX_PARAMS=75000000010" in err[0], err
    assert seconds < 5 and _empty(out)


def test_the_environment_raises_the_limit_a_config_cannot(tmp_path, capsys, monkeypatch):
    """The limit brought down to 5,000 (instead of building big models): the default MLP's
    6,570 parameters are refused; FEDBUG_MAX_PARAMS=6570 in the environment lets it through,
    6569 does not."""
    monkeypatch.setattr(model_size, "DEFAULT_MAX_PARAMS", 5_000)
    monkeypatch.delenv(model_size.MAX_PARAMS_ENV, raising=False)
    with pytest.raises(ConfigError, match="6,570 parameters, over the limit of 5,000"):
        build_model("mlp", (1, 8, 8), 10, 0)
    rc, err, out, _ = _run(tmp_path, {"model": "mlp"}, capsys)
    assert rc == 2 and len(err) == 1 and "FEDBUG_MAX_PARAMS=6570" in err[0] and _empty(out)
    monkeypatch.setenv(model_size.MAX_PARAMS_ENV, str(MLP_DIGITS))
    assert sum(p.numel() for p in build_model("mlp", (1, 8, 8), 10, 0).parameters()) == 6_570
    assert _run(tmp_path, {"model": "mlp"}, capsys)[0] == 0
    monkeypatch.setenv(model_size.MAX_PARAMS_ENV, str(MLP_DIGITS - 1))
    with pytest.raises(ConfigError, match="over the limit of 6,569"):
        build_model("mlp", (1, 8, 8), 10, 0)


@pytest.mark.parametrize(
    ("hidden", "words"),
    [
        ([1] * 1001, "1001 layers, over fedbug's limit of 1,000"),  # 10^5 took 14 s on meta
        ([64, 0], "at least 1, not 0"),  # built a layer that passes nothing on
        ([-3], "at least 1, not -3"),  # torch's "negative dimension -3: [-3, 64]"
    ],
)
def test_mlp_depth_and_widths_are_bounded(hidden, words):
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=rf"'mlp' .*model_options\.hidden: .*{words}"):
        build_model("mlp", (1, 8, 8), 10, 0, hidden=hidden)
    assert time.perf_counter() - start < 1


@pytest.mark.parametrize("value", ["lots", "0", "-5", "1.5"])
def test_a_limit_that_is_not_a_positive_whole_number_is_one_line(monkeypatch, value):
    monkeypatch.setenv(model_size.MAX_PARAMS_ENV, value)
    with pytest.raises(ConfigError, match=f"FEDBUG_MAX_PARAMS={value!r}: a whole number"):
        build_model("mlp", (1, 8, 8), 10, 0)


def test_a_huge_hf_model_is_counted_not_built(monkeypatch):
    """100 GPT-2 blocks of width 4096 (20 billion parameters): refused in one line, counted
    on the meta device (the real build would ask for 80 GB)."""
    pytest.importorskip("transformers")
    hf_config = {**GPT2, "n_layer": 100, "n_embd": 4096, "n_head": 32}
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"model 'hf' has [\d,]+ parameters, over the limit"):
        build_model("hf", (8,), 12, 0, hf_config=hf_config, task="next_token")
    assert time.perf_counter() - start < 10


def test_a_pretrained_folder_is_counted_without_reading_its_weights(tmp_path, monkeypatch):
    """hf:FOLDER whose weights file is damaged: the count reads config.json only, so the
    refusal is the size, not the weights."""
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "gpt2"
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**GPT2, "vocab_size": 12}))
    model.save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"not weights")
    monkeypatch.setenv(model_size.MAX_PARAMS_ENV, "100")
    count = sum(p.numel() for p in model.parameters())
    with pytest.raises(ConfigError, match=f"{count:,} parameters, over the limit of 100"):
        build_model(f"hf:{folder}", (8,), 12, 0, task="next_token")


# ---------------------------------------------------------------- every model counts on meta

SHAPES = {
    "standard_cnn": (3, 32, 32),
    "digits_cnn": (1, 8, 8),
    "mlp": (1, 8, 8),
    "resnet18": (3, 32, 32),
    "resnet34": (3, 32, 32),
    "tiny_imagenet_cnn": (3, 64, 64),
    "fedseq_cnn": (1, 28, 28),
    "shakespeare_lstm": (80,),
    "leaf_cnn": (1, 28, 28),
    "freezefl_cnn": (1, 28, 28),
    "logreg": (60,),
}


def test_every_built_in_model_is_counted_on_meta_as_built():
    assert set(SHAPES) == set(MODELS.names())
    for name, shape in SHAPES.items():
        real = MODELS.get(name)(shape, 80)
        counted = model_size.count_params(lambda n=name, s=shape: MODELS.get(n)(s, 80))
        assert counted == model_size.tensor_count(real), name


@pytest.mark.parametrize("adapters", [None, {"kind": "lora", "r": 2}])
def test_a_hf_model_is_counted_on_meta_as_built(adapters):
    """With LoRA the base weights are buffers: counted too (what the model holds)."""
    pytest.importorskip("peft" if adapters else "transformers")
    options = {"hf_config": GPT2, "task": "next_token", "adapters": adapters}
    real = build_model("hf", (8,), 12, 0, **options)
    counted = model_size.count_params(lambda: build_model("hf", (8,), 12, 0, **options))
    assert counted == model_size.tensor_count(real) > 0


# ---------------------------------------------------------------- what is left as it was


def test_a_normal_model_gets_the_same_weights_as_before():
    """The count draws nothing from the run's generator: the weights are those of the seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(3, "model"))
        expected = MLP((1, 8, 8), 10)
    built = build_model("mlp", (1, 8, 8), 10, 3)
    for (n, p), q in zip(expected.named_parameters(), built.parameters(), strict=True):
        assert torch.equal(p, q), n


def test_an_own_class_that_cannot_be_built_on_meta_is_built_unchecked(tmp_path, monkeypatch):
    """A class of the user's own (trusted code) that cannot run on the meta device is not
    counted; one that can is held to the limit as any other."""
    (tmp_path / "own_models.py").write_text(
        "import torch\nfrom torch import nn\n\n\n"
        "class NeedsData(nn.Module):\n"
        "    def __init__(self, width=4):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(int(torch.ones(1).item()) * width, 10)\n\n\n"
        "class Wide(nn.Module):\n"
        "    def __init__(self, width=4):\n"
        "        super().__init__()\n"
        "        self.fc = nn.Linear(width, 10)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(model_size.MAX_PARAMS_ENV, "40")
    assert model_size.tensor_count(build_model("own_models:NeedsData", (4,), 10, 0)) == 50
    with pytest.raises(ConfigError, match="'own_models:Wide' has 50 parameters"):
        build_model("own_models:Wide", (4,), 10, 0)


def test_any_torch_module_class_a_config_names_is_counted():
    """A config may name any installed ``nn.Module`` class without --allow-import: torch's own
    Linear of 10^6 x 10^6 (4 TB) is counted, not built."""
    with pytest.raises(ConfigError, match=r"'torch\.nn:Linear' has 1,000,001,000,000 parameters"):
        build_model("torch.nn:Linear", (4,), 10, 0, in_features=10**6, out_features=10**6)
