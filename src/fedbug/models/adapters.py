"""Adapters as the trainable part of a model: LoRA through ``peft`` (``pip install 'fedbug[hf]'``).

``adapters: {kind: lora, r: 8, alpha: 16, targets: [c_attn]}`` puts LoRA's low-rank pair
(Hu et al. 2022, ``W x + (alpha / r) B A x``, A drawn, B zero, so the adapted model starts as
the base) beside each target layer with ``peft.inject_adapter_in_model`` (module names as peft
takes them: a name, or its last parts, ``attn.c_attn`` or ``c_attn``; without ``targets``,
peft's default for the model type: GPT-2's ``c_attn``, Llama's ``q_proj, v_proj``, BERT's
``query, value``).

The base model's weights then become constants: each one leaves the model's parameters for a
non-persistent buffer, so the only parameters are the adapters' (and those of the layers named
in ``full_layers``, trained whole: a sequence classifier's new head, ``classifier`` in BERT,
``score`` in GPT-2 and Llama, as peft's ``modules_to_save``). fedbug's flat vector, and so
what trains, what is sent up and down (the bytes recorded), what is averaged (the plain mean of
A and of B, as FedIT / OpenFedLLM do) and what a checkpoint holds, is the adapters alone; the
base is rebuilt identically everywhere from the run's seed (``hf_config``) or the pretrained
folder (``hf:<name>``).

The mean of the factors is not the factor of the mean: mean(B_i) mean(A_i) != mean(B_i A_i).
``freeze_a: true`` is FFA-LoRA (Sun et al. 2024, "Improving LoRA in Privacy-preserving
Federated Learning"): A stays as drawn (from the run's seed, the same on every client) and
only B trains and travels, so averaging B averages the products exactly,
mean(B_i) A = mean(B_i A), and A's bytes are never sent.

With ``units: blocks`` (the default under adapters) every freeze policy acts on each block's
adapters.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from fedbug.errors import ConfigError


class AdapterParams(BaseModel):
    """The ``adapters:`` block."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["lora"] = "lora"
    r: int = Field(8, ge=1, le=65_536, description="the rank of A (r x in) and B (out x r)")
    alpha: float = Field(16.0, gt=0.0, le=1e6, description="LoRA's scale is alpha / r")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapters' input")
    targets: list[str] | None = Field(
        None, min_length=1, description="layer names (or their last parts); default: peft's"
    )
    freeze_a: bool = Field(
        False, description="FFA-LoRA: A stays as drawn, only B trains and travels"
    )
    full_layers: list[str] = Field(
        default_factory=list,
        description="layers trained whole beside the adapters (a new head: classifier, score)",
    )


def adapter_head_incompatibility(cfg: Any, algorithm: Any) -> str | None:
    """Why ``algorithm`` (a class) cannot keep a head under ``cfg``'s adapters, or None. Under
    adapters without ``full_layers`` the model's own head is a constant (only adapters train),
    so the last unit, an algorithm's "head", is the last block's adapters: an algorithm that
    keeps a head apart (personal, ``local_units``; or never trained, FedBABU and FedSeq's
    schedules) would keep those instead."""
    adapters = getattr(cfg, "adapters", None)
    if adapters is None or adapters.full_layers:
        return None
    if algorithm.splits_body_head and algorithm.overrides("local_units"):
        who = f"{cfg.algorithm} keeps a personal head on each client"
    elif algorithm.splits_body_head or getattr(cfg, "schedule", "none") != "none":
        name = cfg.algorithm if algorithm.splits_body_head else "a FedSeq schedule"
        who = f"{name} keeps a head apart from the base"
    else:
        return None
    return (
        f"{who}, and under adapters: without full_layers the model's head is a constant (only "
        "adapters train), so its head would be the last block's adapters; name the head to "
        "train whole in adapters.full_layers (e.g. [classifier], [score], or [lm_head] with "
        "tie_word_embeddings: false), or use a method without a head apart"
    )


def _peft() -> Any:
    try:
        return importlib.import_module("peft")
    except ImportError:
        raise ConfigError("adapters: need the peft package: pip install 'fedbug[hf]'") from None


def layer_names(model: nn.Module) -> list[str]:
    """The last part of the name of each parameter-owning layer, once, in model order (what a
    LoRA target may name)."""
    names = (n.rpartition(".")[2] for n, m in model.named_modules() if n and _owns(m))
    return list(dict.fromkeys(names))


def _owns(m: nn.Module) -> bool:
    return any(True for _ in m.parameters(recurse=False))


def check_targets(model: nn.Module, targets: list[str], key: str = "targets") -> None:
    """Refuse, in one line naming the layers that exist, a target that matches no layer (a
    target matches a module named it or ending in ``.target``, as in peft)."""
    names = [n for n, m in model.named_modules() if n and _owns(m)]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise ConfigError(
            f"adapters.{key}: {', '.join(missing)} match(es) no layer of "
            f"{type(model).__name__}; its layers: {', '.join(layer_names(model))}"
        )


def add_adapters(model: nn.Module, params: AdapterParams | dict[str, Any]) -> nn.Module:
    """``model`` with LoRA adapters injected in place and its own weights made constants
    (module docstring); the adapters' random A comes from torch's global generator."""
    p = params if isinstance(params, AdapterParams) else AdapterParams(**params)
    peft = _peft()
    for key, names in (("targets", p.targets), ("full_layers", p.full_layers)):
        check_targets(model, names or [], key)
    config = peft.LoraConfig(
        r=p.r, lora_alpha=p.alpha, lora_dropout=p.dropout, target_modules=p.targets
    )
    whole = {id(w) for n, w in model.named_parameters() if _under(n, p.full_layers)}
    base = {id(w) for w in model.parameters()} - whole
    try:
        with warnings.catch_warnings():  # GPT-2's Conv1D keeps its weight transposed: peft
            warnings.filterwarnings("ignore", "fan_in_fan_out is set to False")  # sees to it
            model = peft.inject_adapter_in_model(config, model)
    except ValueError as e:  # peft's own refusal (no default targets for this model type)
        raise ConfigError(
            f"adapters: {e} (its layers: {', '.join(layer_names(model))}); name them in "
            "adapters.targets"
        ) from None
    if p.freeze_a:
        base |= {id(w) for n, w in model.named_parameters() if ".lora_A." in n}
    weights_as_constants(model, base)
    return model


def _under(param: str, layers: list[str]) -> bool:
    """Whether a parameter belongs to a layer named (or ending in) one of ``layers``."""
    module = param.rpartition(".")[0]
    return any(module == t or module.endswith("." + t) for t in layers)


def weights_as_constants(model: nn.Module, ids: set[int]) -> None:
    """Every parameter whose id is in ``ids`` becomes a non-persistent buffer of its module
    (a weight tied between two modules stays one storage)."""
    for mod in model.modules():
        for name, w in list(mod._parameters.items()):
            if w is not None and id(w) in ids:
                del mod._parameters[name]
                mod.register_buffer(name, w.detach(), persistent=False)
