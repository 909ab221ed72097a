"""Cut a model into ordered trainable units, input to output, and lay its weights in one vector.

A *unit* is what a freeze policy freezes or unfreezes as a whole (the FedBug paper's "module";
we avoid the word, which PyTorch already means). By default every layer that owns parameters is
a unit, in the order a traced forward pass first calls it; normalisation layers join the unit of
the layer before them. A model may declare its own units with a ``fedbug_units()`` method
returning a list of submodule names (or of lists of names), and a user may pass such a list.

:class:`ParamSpace` lays all parameters (and floating-point buffers) of a model unit by unit in
one flat float32 vector, so a unit is a contiguous slice: loading weights is one copy, an update
is one subtraction and a partial upload is a slice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod

import torch
from torch import Tensor, nn

from fedbug.errors import ConfigError

NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._NormBase,
    nn.GroupNorm,
    nn.LayerNorm,
    nn.LocalResponseNorm,
    nn.RMSNorm,
)


#: units listed by name, input to output: a submodule's name, or a list of names for one unit
UnitNames = Sequence[str | Sequence[str]]


@dataclass(frozen=True)
class Unit:
    """One trainable unit: its name, the submodules it covers and their parameter names."""

    name: str
    modules: tuple[str, ...]
    params: tuple[str, ...]


def _owns_params(m: nn.Module) -> bool:
    return any(True for _ in m.parameters(recurse=False))


def traced_module_order(model: nn.Module, example_input: Tensor | Sequence[Tensor]) -> list[str]:
    """Names of the parameter-owning submodules in the order a forward pass first calls them."""
    order: list[str] = []
    seen: set[str] = set()
    handles = []
    for name, mod in model.named_modules():
        if not _owns_params(mod):
            continue

        def hook(_m: nn.Module, _inp: object, name: str = name) -> None:
            if name not in seen:
                seen.add(name)
                order.append(name)

        handles.append(mod.register_forward_pre_hook(hook))
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            args = example_input if isinstance(example_input, (tuple, list)) else (example_input,)
            model(*args)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    return order


def check_traced(model: nn.Module, order: Sequence[str]) -> None:
    """Refuse a model whose forward pass reads parameters of a submodule it never calls (``x @
    self.fc.weight.T``): tracing, which sees module calls, cannot tell where those parameters
    sit input to output, and a guessed place would make a freeze policy freeze the wrong
    layer. ``order`` is :func:`traced_module_order`'s; the error names the parameters and the
    two fixes (call the submodule, or list the units)."""
    traced = set(order)
    covered = {
        f"{n}.{p}" if n else p
        for n in traced
        for p, _ in model.get_submodule(n).named_parameters(recurse=False)
    }
    missed = [n for n, _ in model.named_parameters() if n not in covered]
    if not missed:
        return
    modules = list(dict.fromkeys(p.rpartition(".")[0] for p in missed))
    listed = list(dict.fromkeys([*(n for n in order if n), *modules]))
    raise ConfigError(
        f"{type(model).__name__}'s forward pass never calls {', '.join(modules)}, so tracing "
        f"cannot place {', '.join(missed)} among the units; if forward reads the weights "
        f"itself (x @ self.{modules[0]}.weight.T), call the submodule (self.{modules[0]}(x)), "
        "if they are unused, remove them, or list every unit in order, input to output "
        f"(units: [{', '.join(listed)}] in the config, or a fedbug_units() method)"
    )


def _params_under(model: nn.Module, module_name: str) -> tuple[str, ...]:
    mod = model.get_submodule(module_name) if module_name else model
    prefix = f"{module_name}." if module_name else ""
    return tuple(prefix + n for n, _ in mod.named_parameters())


def find_units(
    model: nn.Module,
    example_input: Tensor | Sequence[Tensor] | None = None,
    names: Sequence[str | Sequence[str]] | None = None,
) -> list[Unit]:
    """The model's units, input to output.

    ``names`` (or the model's ``fedbug_units()``) lists submodule names, one entry per unit (an
    entry may itself be a list of names grouped into one unit). Otherwise the units are found by
    tracing a forward pass on ``example_input``. Every parameter must fall in exactly one unit.
    """
    if names is None:  # the model's own list, where it declares one
        names = declared_units(model)
    if names is not None:
        units = []
        for entry in names:
            group = (entry,) if isinstance(entry, str) else tuple(entry)
            params: list[str] = []
            for mod_name in group:
                try:
                    model.get_submodule(mod_name)
                except AttributeError:
                    known = [n for n, m in model.named_modules() if n and _owns_params(m)]
                    raise ConfigError(
                        f"unit {mod_name!r} is not a submodule of {type(model).__name__}; "
                        f"parameter-owning submodules: {', '.join(known)}"
                    ) from None
                params.extend(_params_under(model, mod_name))
            units.append(Unit("+".join(group), group, tuple(params)))
    else:
        if example_input is None:
            raise ValueError("find_units needs example_input to trace the forward pass")
        order = traced_module_order(model, example_input)
        check_traced(model, order)
        groups: list[list[str]] = []
        for name in order:
            if groups and isinstance(model.get_submodule(name), NORM_TYPES):
                groups[-1].append(name)
            else:
                groups.append([name])
        units = []
        for traced in groups:
            params = [
                f"{n}.{p}" if n else p
                for n in traced
                for p, _ in model.get_submodule(n).named_parameters(recurse=False)
            ]
            units.append(Unit(traced[0] or "root", tuple(traced), tuple(params)))
    units = _tied_once(model, units)
    _check_cover(model, units)
    return units


def declared_units(model: nn.Module) -> UnitNames | None:
    """The units ``model`` declares with a ``fedbug_units()`` method; None where it declares
    none (or its method returns None): it is traced."""
    declare = getattr(model, "fedbug_units", None)
    return declare() if callable(declare) else None


def unit_renamer(model: nn.Module, wrapped: nn.Module) -> Callable[[str], str]:
    """A submodule name of ``model`` (``a+b`` for a group) as ``wrapped``, the model an
    algorithm made of it, names it (FedROD's wrapper holds it as ``model``: ``fc`` becomes
    ``model.fc``); a name that is not ``model``'s is left as it is, for the checks of
    :func:`find_units` and ``build_layout`` to refuse with the names that exist. The one
    renamer: the engine's builder renames the config's units and the model's with it, and a
    wrapper's ``fedbug_units()`` (:func:`wrapped_units`) too."""
    if wrapped is model:
        return lambda name: name
    where = {id(m): name for name, m in wrapped.named_modules()}

    def rename(name: str) -> str:
        try:
            return "+".join(where[id(model.get_submodule(n))] for n in name.split("+"))
        except (AttributeError, KeyError):
            return name

    return rename


def renamed_units(listed: UnitNames, rename: Callable[[str], str]) -> list[str | list[str]]:
    """``listed`` (one name or a group of names a unit) with every name renamed."""
    return [rename(e) if isinstance(e, str) else [rename(n) for n in e] for e in listed]


def wrapped_units(
    wrapped: nn.Module, model: nn.Module, extra: Sequence[str] = ()
) -> list[str | list[str]] | None:
    """What a wrapper's ``fedbug_units()`` returns: the units ``model``, the model inside
    ``wrapped``, declares, renamed as ``wrapped`` names them, then ``extra`` (the modules the
    wrapper adds, its algorithm's ``extra_modules``); None where ``model`` declares none, so
    the wrapper is traced as the engine traces it."""
    listed = declared_units(model)
    if listed is None:
        return None
    return [*renamed_units(listed, unit_renamer(model, wrapped)), *extra]


def _tied_once(model: nn.Module, units: list[Unit]) -> list[Unit]:
    """Each parameter once, under the name ``named_parameters`` gives it, in the first unit that
    holds it: a tied weight (GPT-2's head reuses its token embedding's matrix, ``lm_head.weight``
    is ``transformer.wte.weight``) trains with its first unit, input to output; a unit that held
    nothing else is dropped."""
    first = {id(p): n for n, p in model.named_parameters()}
    seen: set[str] = set()
    out = []
    for u in units:
        names = [first[id(model.get_parameter(p))] for p in u.params]
        kept = tuple(dict.fromkeys(n for n in names if n not in seen))
        seen.update(kept)
        if u.params and not kept:
            continue  # it held only a tied weight: no unit of its own
        out.append(u if kept == u.params else Unit(u.name, u.modules, kept))
    return out


def _check_cover(model: nn.Module, units: list[Unit]) -> None:
    all_params = [n for n, _ in model.named_parameters()]
    counts: dict[str, int] = {}
    for u in units:
        for p in u.params:
            counts[p] = counts.get(p, 0) + 1
    twice = [p for p, c in counts.items() if c > 1]
    missing = [p for p in all_params if p not in counts]
    if twice:
        raise ConfigError(f"parameters in more than one unit: {', '.join(twice)}; list each once")
    if missing:
        raise ConfigError(
            f"parameters in no unit: {', '.join(missing)}; add their submodules to the unit list "
            "(or, when tracing, make sure the forward pass uses them)"
        )


def _buffer_units(units: list[Unit], buffers: dict[str, Tensor]) -> dict[str, int]:
    """Each float buffer's unit: the unit of the module that owns it, else of its nearest
    ancestor module that a unit lists; buffers outside every unit are left out."""
    unit_of_module = {m: i for i, u in enumerate(units) for m in u.modules}
    out: dict[str, int] = {}
    for name in buffers:
        path = name.rpartition(".")[0]
        while True:
            if path in unit_of_module:
                out[name] = unit_of_module[path]
                break
            if not path:
                break
            path = path.rpartition(".")[0]
    return out


def _non_persistent(model: nn.Module, name: str) -> bool:
    """Whether a buffer is left out of the state dict (a rotary embedding's ``inv_freq``, which
    the model computes from its config): no state, so no place in the flat vector."""
    owner, _, attr = name.rpartition(".")
    return attr in model.get_submodule(owner)._non_persistent_buffers_set


class ParamSpace:
    """All of a model's parameters and float buffers laid out unit by unit in one flat vector."""

    def __init__(self, model: nn.Module, units: list[Unit]) -> None:
        self.units = units
        named_params = dict(model.named_parameters())
        named_buffers = {
            n: b
            for n, b in model.named_buffers()
            if b is not None and b.is_floating_point() and not _non_persistent(model, n)
        }
        self.names: list[str] = []
        self.is_param: list[bool] = []
        self.shapes: list[tuple[int, ...]] = []
        self.unit_of: list[int] = []
        buffer_unit = _buffer_units(units, named_buffers)
        bounds = []
        offset = 0
        for ui, unit in enumerate(units):
            start = offset
            entries = list(unit.params) + [b for b, u in buffer_unit.items() if u == ui]
            for name in entries:
                t = named_params[name] if name in named_params else named_buffers[name]
                self.names.append(name)
                self.is_param.append(name in named_params)
                self.shapes.append(tuple(t.shape))
                self.unit_of.append(ui)
                offset += t.numel()
            bounds.append((start, offset))
        self.numels = [prod(s) for s in self.shapes]
        self.offsets = [sum(self.numels[:i]) for i in range(len(self.numels))]
        self.total = offset
        self.unit_slices = [slice(a, b) for a, b in bounds]
        self.unit_numel = [b - a for a, b in bounds]
        self.unit_param_numel = [
            sum(n for n, u, p in zip(self.numels, self.unit_of, self.is_param) if u == ui and p)
            for ui in range(len(units))
        ]

    @property
    def num_units(self) -> int:
        return len(self.units)

    def flatten(self, model: nn.Module) -> Tensor:
        """A new flat float32 vector holding the model's current values."""
        state = model.state_dict()
        return torch.cat([state[n].detach().reshape(-1).to(torch.float32) for n in self.names])

    def bind(self, model: nn.Module) -> Tensor:
        """Make the model's parameters and float buffers views into one new flat vector.

        Returns the vector: writing into it writes the model's weights and vice versa.
        """
        flat = self.flatten(model)
        for name, is_param, off, n, shape in zip(
            self.names, self.is_param, self.offsets, self.numels, self.shapes
        ):
            mod_name, _, attr = name.rpartition(".")
            mod = model.get_submodule(mod_name) if mod_name else model
            view = flat[off : off + n].view(shape)
            if is_param:
                getattr(mod, attr).data = view
            else:
                mod._buffers[attr] = view
        return flat

    def param_slots(self) -> list[tuple[str, int, int, tuple[int, ...], int]]:
        """(name, offset, numel, shape, unit) of each parameter in the flat vector, in order
        (float buffers left out)."""
        return [
            (name, off, n, shape, u)
            for name, is_param, off, n, shape, u in zip(
                self.names, self.is_param, self.offsets, self.numels, self.shapes, self.unit_of
            )
            if is_param
        ]

    def unit_mask(self, units: Sequence[int] | range) -> Tensor:
        """A bool vector over the flat space, true on the given units' entries."""
        mask = torch.zeros(self.total, dtype=torch.bool)
        for u in units:
            mask[self.unit_slices[u]] = True
        return mask

    def bytes_of(self, trained: Sequence[bool] | Tensor) -> int:
        """Bytes (float32) of the units flagged in ``trained``."""
        return 4 * sum(n for n, t in zip(self.unit_numel, trained) if bool(t))

    def state_dict(self, flat: Tensor) -> dict[str, Tensor]:
        """The flat vector as a name -> tensor dict (copies)."""
        return {
            name: flat[off : off + n].view(shape).clone()
            for name, off, n, shape in zip(self.names, self.offsets, self.numels, self.shapes)
        }


def unit_regions(units: Sequence[int], space: ParamSpace) -> list[slice]:
    """Slices of the flat vector covering ``units``, one per run of consecutive units."""
    sl = space.unit_slices
    regions: list[slice] = []
    for u in units:
        if regions and regions[-1].stop == sl[u].start:
            regions[-1] = slice(regions[-1].start, sl[u].stop)
        else:
            regions.append(slice(sl[u].start, sl[u].stop))
    return regions
