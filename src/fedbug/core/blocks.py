"""``units: blocks``: a model cut at its repeated blocks into embedding, each block and head.

Most deep models repeat one block: a transformer's layer list (GPT-2's ``transformer.h``,
BERT's ``bert.encoder.layer``, Llama's ``model.layers``), a ResNet's stages (``layer1`` ..
``layer4``). Freezing whole blocks is what federated fine-tuning of such models does (FedBug
unfreezing bottom-up by block, FedSeq scheduling them), where fedbug's default, one unit per
traced layer, gives dozens of ``Linear`` units.

The block list is found from the module tree, not from names of known architectures: every
container (``ModuleList`` or ``Sequential``) of two or more children of one class, and every
run of two or more siblings of one class named ``<prefix>1``, ``<prefix>2``, ... (a ResNet's
``layer1`` .. ``layer4``), is a candidate; the one holding the most parameters is the model's
block list (the outermost on a tie: a ResNet's stages, not the blocks inside its first stage).
A traced forward pass then places every parameter-owning module: called before the first
block, it joins the embedding unit; inside block i, block i's; after, the head. Units run
input to output in that order: ``[embedding, block 0, ..., block L-1, head]`` (the embedding
or head left out where nothing comes before or after the blocks).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from torch import Tensor, nn

from fedbug.core.units import traced_module_order
from fedbug.errors import ConfigError

Entry = str | list[str]


def _numel(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def _container_lists(model: nn.Module) -> list[list[str]]:
    out = []
    for name, mod in model.named_modules():
        if not isinstance(mod, (nn.ModuleList, nn.Sequential)):
            continue
        kids = list(mod.named_children())
        if len(kids) >= 2 and len({type(m) for _, m in kids}) == 1:
            out.append([f"{name}.{k}" if name else k for k, _ in kids])
    return out


def _numbered_siblings(model: nn.Module) -> list[list[str]]:
    """Runs ``<prefix>1, <prefix>2, ...`` (or from 0) of children of one class."""
    out = []
    for name, mod in model.named_modules():
        groups: dict[str, dict[int, nn.Module]] = {}
        for child, m in mod.named_children():
            match = re.fullmatch(r"(.*?[A-Za-z_])(\d+)", child)
            if match:
                groups.setdefault(match[1], {})[int(match[2])] = m
        for prefix, found in groups.items():
            first = min(found)
            run: list[int] = []
            while first + len(run) in found:
                run.append(first + len(run))
            if len(run) >= 2 and len({type(found[i]) for i in run}) == 1:
                out.append([f"{name}.{prefix}{i}" if name else f"{prefix}{i}" for i in run])
    return out


def find_blocks(model: nn.Module) -> list[str]:
    """The names of the model's repeated blocks, in list order (module docstring)."""
    candidates = _container_lists(model) + _numbered_siblings(model)
    sized = [
        (sum(_numel(model.get_submodule(n)) for n in c), -c[0].count("."), c) for c in candidates
    ]
    sized = [s for s in sized if s[0] > 0]
    if not sized:
        raise ConfigError(
            f"units: blocks needs a repeated block list (a ModuleList or Sequential of two or "
            f"more blocks of one class, or siblings layer1, layer2, ...), and "
            f"{type(model).__name__} has none; list the units instead (units: [[...], ...])"
        )
    return max(sized, key=lambda s: (s[0], s[1]))[2]


def block_units(model: nn.Module, example_input: Tensor | Sequence[Tensor]) -> list[Entry]:
    """The model's units by block: embedding, each block, head (module docstring), as a unit
    list of submodule names (what ``units:`` takes)."""
    # a block that owns no parameter (no adapter on its layers) is no unit
    blocks = [b for b in find_blocks(model) if _numel(model.get_submodule(b))]
    order = traced_module_order(model, example_input)
    first_call: dict[str, int] = {}
    for i, name in enumerate(order):
        for block in blocks:
            if name == block or name.startswith(block + "."):
                first_call.setdefault(block, i)
                break
    uncalled = [b for b in blocks if b not in first_call]
    if uncalled:
        raise ConfigError(
            f"units: blocks: the forward pass never calls the blocks {', '.join(uncalled)} of "
            f"{type(model).__name__}; list the units instead (units: [[...], ...])"
        )
    start, end = min(first_call.values()), max(first_call.values())
    inside = {n for n in order if any(n == b or n.startswith(b + ".") for b in blocks)}
    before = [n for n in order[:start] if n not in inside]
    after = [n for n in order[end:] if n not in inside]
    stray = [n for n in order[start:end] if n not in inside]
    if stray:
        raise ConfigError(
            f"units: blocks: {', '.join(stray)} run between the blocks of "
            f"{type(model).__name__}, in no block; list the units instead (units: [[...], ...])"
        )
    ordered = sorted(blocks, key=first_call.__getitem__)
    return [*([before] if before else []), *ordered, *([after] if after else [])]
