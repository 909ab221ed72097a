"""Hugging Face ``transformers`` models as fedbug models (``pip install 'fedbug[hf]'``).

Two ways to name one in a config:

* ``model: hf:<name or local folder>``: ``from_pretrained`` from a local folder or the local
  Hugging Face cache, never from the network (``local_files_only``); a model found in neither
  is one :class:`~fedbug.errors.ConfigError` saying where fedbug looked and how to fetch it.
  ``hf_config:`` beside it overrides keys of the saved config. A folder's own Python
  (``auto_map``, transformers' ``trust_remote_code``) never runs: ``hf_config`` may not name
  ``trust_remote_code``, and fedbug passes ``trust_remote_code=False``; nor does a kernel on the
  Hub that ``attn_implementation`` names (in ``hf_config`` or the folder's config.json).
* ``model: hf`` with ``hf_config: {model_type: gpt2, n_layer: 2, n_embd: 32, ...}``: the
  architecture built from those keys (``AutoConfig.for_model``) with random weights drawn under
  the run's model seed, as every fedbug model is; how the tests run, with no weights to fetch.

The task picks the head: ``next_token`` a causal LM (``AutoModelForCausalLM``; ``vocab_size``
defaults to the data set's ``num_classes``, its vocabulary), ``classification`` a sequence
classifier (``AutoModelForSequenceClassification`` with ``num_labels`` the data set's classes).
The model takes token ids (N, T) and returns its logits as a tensor (a forward hook takes
``.logits`` out of the model's output), so fedbug's tasks, unit tracing, FLOP and memory
counter and flat-weight binding treat it as any other module. fedbug's ``next_token`` data hold
one target per sequence (LEAF Shakespeare's character after the 80 before it), so a causal LM
gives the scores of the token after each sequence, (N, V), as ``shakespeare_lstm`` does: its
head (``get_output_embeddings()``) takes the last position's hidden state only, (N, d), so it
runs once per sequence and an algorithm that reads the classifier's input (FedROD's personal
head, FedDecorr) gets one feature row per sample. ``targets: every`` trains a causal LM as one
is usually trained, on the token after every position (the window shifted by one, then the
sequence's target: :func:`fedbug.data.targets.every_position_targets`): the head runs on every
position and the model returns (N, T, V); evaluation still scores the token after each test
sequence, the last position's, so accuracy is comparable with ``targets: last``.
``use_cache`` is off: a training step keeps no key/value cache.

``model_options: {gradient_checkpointing: true}`` checkpoints each block (the model's
``activation_checkpointing_enable``, torch's non-reentrant checkpoint): the forward pass keeps
only each block's input for backward and runs the block again in backward, so a client's
counted step memory (:mod:`fedbug.core.flops`, the bytes saved for backward) falls to the
blocks' inputs and its FLOPs grow by at most one more forward of the trained blocks. The
numbers are bit for bit those without it (the same kernels on the same inputs; dropout's draws
replayed). The count leaves out the one block rebuilt at a time during backward (at most one
block's share of the count without checkpointing). Non-reentrant, so a block below the lowest
trained one is neither kept nor run again, and the input-gradient hook transformers adds for
reentrant checkpointing is removed (it would make frozen bottom blocks run backward).
"""

from __future__ import annotations

import importlib
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fedbug.errors import ConfigError, first_line
from fedbug.models.adapters import add_adapters
from fedbug.models.size import MAX_LAYERS

#: the ``AutoModelFor...`` class of each task's head
HEADS = {
    "next_token": "AutoModelForCausalLM",
    "classification": "AutoModelForSequenceClassification",
}
PREFIX = "hf:"
INSTALL = "pip install 'fedbug[hf]'"
#: why an ``attn_implementation`` naming a kernel on the Hub is refused, and the fix
NO_HUB_KERNELS = (
    "names a kernel on the Hugging Face Hub, code that transformers would fetch and run, which "
    "fedbug never loads; use sdpa or eager"
)
#: the way out of a model folder that cannot be read
REFETCH = "fetch the model again (hf download NAME --local-dir FOLDER) or give another folder"
#: the keys (of transformers' configs) that count blocks: each a whole number, 1 to MAX_LAYERS
LAYER_KEYS = (
    "n_layer", "num_hidden_layers", "num_layers", "n_layers", "encoder_layers",
    "decoder_layers", "num_encoder_layers", "num_decoder_layers",
)  # fmt: skip
#: the keys that count heads, widths, vocabularies and positions: each a whole number, at least
#: 1, or null for transformers' default (the size itself is bounded by the parameter count)
SIZE_KEYS = (
    "n_head", "num_attention_heads", "num_key_value_heads", "encoder_attention_heads",
    "decoder_attention_heads", "n_embd", "hidden_size", "d_model", "n_inner",
    "intermediate_size", "d_ff", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "head_dim",
    "d_kv", "vocab_size", "n_positions", "max_position_embeddings", "n_ctx", "num_labels",
)  # fmt: skip


def is_hf(name: str) -> bool:
    """Whether a model name names a Hugging Face model (``hf`` or ``hf:<name or folder>``)."""
    return name == "hf" or name.startswith(PREFIX)


def _transformers() -> Any:
    try:
        return importlib.import_module("transformers")
    except ImportError:
        raise ConfigError(f"Hugging Face models need the transformers package: {INSTALL}") from None


def check_hf_model(
    name: str, hf_config: dict[str, Any] | None, task: str, adapters: Any = None
) -> None:
    """Refuse, in one line, a Hugging Face model a config cannot build: transformers missing,
    ``model: hf`` without ``hf_config.model_type``, a task without a head, ``hf_config`` or
    ``adapters`` beside a model that is not a Hugging Face one, a count in ``hf_config`` (or a
    sub-config in it) that is not a whole number of at least 1, or over :data:`MAX_LAYERS`
    blocks."""
    if not is_hf(name):
        for key, value in (("hf_config", hf_config), ("adapters", adapters)):
            if value is not None:
                raise ConfigError(
                    f"{key}: has no effect under model: {name}; use model: hf (a model built "
                    f"from hf_config) or model: hf:<name or folder>, or remove {key}"
                )
        return
    if "trust_remote_code" in (hf_config or {}):  # a model folder's own Python: never run
        raise ConfigError(
            "hf_config.trust_remote_code: fedbug never runs a model folder's own code (a config "
            "cannot allow it); remove the key and use a model transformers itself defines"
        )
    kernel = _hub_kernel((hf_config or {}).get("attn_implementation"))
    if kernel is not None:
        raise ConfigError(f"hf_config.attn_implementation: {kernel!r} {NO_HUB_KERNELS}")
    _check_counts(hf_config or {}, "hf_config.")
    _transformers()
    if task not in HEADS:
        raise ConfigError(f"task: {task} has no Hugging Face head; use task: {' or '.join(HEADS)}")
    if name == "hf" and not (hf_config or {}).get("model_type"):
        raise ConfigError(
            "model: hf builds its architecture from hf_config, which needs model_type "
            "(hf_config: {model_type: gpt2, n_layer: 2, n_embd: 32, n_head: 2}); or name a "
            "pretrained model, model: hf:<name or folder>"
        )


def _hub_kernel(value: Any) -> str | None:
    """The kernel on the Hugging Face Hub that an ``attn_implementation`` value names (a
    repository, ``org/name``, alone or in a mapping of sub-configs to values), or None."""
    values = value.values() if isinstance(value, dict) else [value]
    return next((v for v in values if isinstance(v, str) and "/" in v), None)


def _check_counts(values: dict[str, Any], where: str) -> None:
    """Refuse a count in ``values`` (``hf_config`` or a sub-config in it, a mapping) that is not a
    whole number of at least 1, or a block count over :data:`MAX_LAYERS`; ``where`` prefixes
    the key in the message (``hf_config.``)."""
    for key, value in values.items():
        if isinstance(value, dict):
            _check_counts(value, f"{where}{key}.")
        elif key in LAYER_KEYS or key in SIZE_KEYS:
            _check_count(f"{where}{key}", key, value)


def _check_count(name: str, key: str, value: Any, fix: str = "fix it or remove the key") -> None:
    if value is None and key in SIZE_KEYS:
        return  # transformers' default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name}: a whole number of at least 1, not {value!r}; {fix}")
    if key in LAYER_KEYS and value > MAX_LAYERS:
        raise ConfigError(
            f"{name}: {value} blocks, over fedbug's limit of {MAX_LAYERS:,} a model built from a "
            "config may have (the largest published models have about 130); use fewer"
        )


def _with_sub_configs(config: Any) -> list[Any]:
    """A transformers config object and the sub-configs it holds (an encoder's, a vision
    tower's), those it has."""
    subs = (getattr(config, k, None) for k in getattr(config, "sub_configs", {}))
    return [config, *filter(None, subs)]


def _check_config_counts(config: Any, where: str) -> None:
    """The counts of a transformers config object (and its sub-configs) read from a model
    folder's config.json, as :func:`_check_counts` checks ``hf_config``."""
    for c in _with_sub_configs(config):
        for key in (*LAYER_KEYS, *SIZE_KEYS):
            value = getattr(c, key, None)
            if value is not None:
                name = f"model hf:{where}: its config.json's {key}"
                fix = f"fix it in config.json or in hf_config: {{{key}: ...}}"
                _check_count(name, key, value, fix)


def _check_attention(config: Any, where: str) -> None:
    """Refuse a saved config (and its sub-configs) whose attention names a kernel on the Hub."""
    values = [getattr(c, "_attn_implementation", None) for c in _with_sub_configs(config)]
    kernel = next(filter(None, map(_hub_kernel, values)), None)
    if kernel is not None:
        raise ConfigError(
            f"model hf:{where}: its config.json's attn_implementation {kernel!r} "
            f"{NO_HUB_KERNELS} (in config.json, or hf_config: {{attn_implementation: sdpa}})"
        )


def build_hf(
    input_shape: tuple[int, ...],
    num_classes: int,
    name: str = "hf",
    hf_config: dict[str, Any] | None = None,
    task: str = "classification",
    adapters: dict[str, Any] | None = None,
    gradient_checkpointing: bool = False,
    targets: str = "last",
) -> nn.Module:
    """The Hugging Face model ``name`` names (``hf`` or ``hf:<name or folder>``) with the head
    of ``task``, returning logits (module docstring), with ``adapters`` where given
    (:mod:`fedbug.models.adapters`) and each block checkpointed under
    ``gradient_checkpointing``; a causal LM scores the last position only, or every position
    under ``targets="every"``. Random weights come from torch's global generator, which
    :func:`fedbug.models.build_model` seeds from the run's seed."""
    check_hf_model(name, hf_config, task, adapters)
    if not isinstance(gradient_checkpointing, bool):
        raise ConfigError(
            f"model_options.gradient_checkpointing: true or false, not {gradient_checkpointing!r}"
        )
    transformers = _transformers()
    head = getattr(transformers, HEADS[task])
    keys = dict(hf_config or {})
    if task == "classification":
        keys.setdefault("num_labels", num_classes)
    if name == "hf":
        model_type = keys.pop("model_type")
        if task == "next_token":
            keys.setdefault("vocab_size", num_classes)
        config = _config_for(transformers, model_type, keys)
        model = head.from_config(config)
    else:
        model = _pretrained(transformers, head, name.removeprefix(PREFIX), keys)
    if len(input_shape) != 1:
        raise ValueError(
            f"a Hugging Face model reads token ids, inputs of shape (T,); the data set's are "
            f"{input_shape}: use a token data set (inputs='tokens')"
        )
    model.config.use_cache = False
    if adapters is not None:
        model = add_adapters(model, adapters)
    if gradient_checkpointing:
        _checkpoint_blocks(model)
    last = task == "next_token" and targets != "every"  # else every position's scores
    head = model.get_output_embeddings() if last else None
    if head is not None:
        head.register_forward_pre_hook(_last_position)
    model.register_forward_hook(_last_logits if last else _logits)
    return model  # type: ignore[no-any-return]


def _checkpoint_blocks(model: nn.Module) -> None:
    """Checkpoint each block of ``model`` with torch's non-reentrant checkpoint (module
    docstring); one line where the model's class offers none."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ConfigError(
            f"model_options.gradient_checkpointing: {type(model).__name__} offers no gradient "
            "checkpointing; remove the option"
        )
    model.activation_checkpointing_enable({"use_reentrant": False})  # type: ignore[operator]
    model.disable_input_require_grads()  # type: ignore[operator]


def _config_for(transformers: Any, model_type: str, keys: dict[str, Any]) -> Any:
    """The transformers config of ``model_type`` with ``keys``; a value of the wrong type that
    transformers' own validation refuses is one :class:`ConfigError` line."""
    from huggingface_hub.errors import StrictDataclassError  # a dependency of transformers

    try:
        return transformers.AutoConfig.for_model(model_type, **keys)
    except StrictDataclassError as e:
        words = " ".join(line.strip() for line in str(e).splitlines())
        raise ConfigError(f"hf_config: {words}; fix the value") from None


def _pretrained(transformers: Any, head: Any, where: str, keys: dict[str, Any]) -> nn.Module:
    """The model saved in ``where`` (a folder, or a name in the Hugging Face cache); a folder
    that cannot be read (a damaged config.json or model.safetensors, weights pickled with
    anything but tensors, which torch refuses unread) is one :class:`ConfigError` line. On the
    meta device (the size count, :mod:`fedbug.models.size`) the model is built from the
    folder's config.json alone, its weights unread."""
    from safetensors import SafetensorError  # a dependency of transformers

    try:
        config = transformers.AutoConfig.from_pretrained(
            where, local_files_only=True, trust_remote_code=False, **keys
        )
        _check_attention(config, where)
        _check_config_counts(config, where)
        if torch.get_default_device().type == "meta":
            return head.from_config(config)  # type: ignore[no-any-return]
        return head.from_pretrained(  # type: ignore[no-any-return]
            where,
            config=config,
            local_files_only=True,
            trust_remote_code=False,
            ignore_mismatched_sizes=bool(keys),
        )
    except OSError as e:
        if not Path(where).is_dir():
            raise ConfigError(not_found(where)) from None
        why = first_line(e, drop_period=True)
        raise ConfigError(f"model hf:{where}: {why}; {REFETCH}") from None
    except pickle.UnpicklingError:  # torch's refusal (weights_only) of a pickle's other objects
        raise ConfigError(
            f"model hf:{where}: its weights file holds objects other than tensors, refused "
            "unread (nothing in it ran); give a folder whose weights are model.safetensors"
        ) from None
    except SafetensorError as e:
        raise ConfigError(
            f"model hf:{where}: model.safetensors: {first_line(e, drop_period=True)}; {REFETCH}"
        ) from None


def not_found(where: str) -> str:
    """Where fedbug looked for a pretrained model ``where`` and how to get it, in one line."""
    from huggingface_hub.constants import HF_HUB_CACHE

    folder = Path(where).expanduser().resolve()
    return (
        f"model hf:{where}: no model folder at {folder} and not in the Hugging Face cache "
        f"{HF_HUB_CACHE} (fedbug never downloads); fetch it once where there is network with "
        f"`hf download {where}` (the same cache, or set HF_HUB_CACHE), or give the folder that "
        "holds its config.json and weights"
    )


def _logits(module: nn.Module, args: Any, output: Any) -> Any:
    """Forward hook: the model's logits in place of its output object (hooks are module-level
    functions, so a model with them pickles for worker processes)."""
    return getattr(output, "logits", output)


def _last_logits(module: nn.Module, args: Any, output: Any) -> Any:
    """Forward hook of a causal LM: the last position's logits, (N, V)."""
    logits = getattr(output, "logits", output)
    return logits[:, -1] if logits.dim() == 3 else logits


def _last_position(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Forward pre-hook of a causal LM's head: the last position's hidden state, (N, d) (a copy
    of the head, FedROD's personal one, given (N, d) features, takes them as they are)."""
    x = args[0]
    return (x[:, -1], *args[1:]) if x.dim() == 3 else args
