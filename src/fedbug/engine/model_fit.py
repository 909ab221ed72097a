"""Whether a model fits its data, checked before round 1 with one forward pass: a layer that
fails on its input is named with the sizes it takes and gets and the fix; an output the task
cannot use is named by the task."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from fedbug.core.tasks import Task
from fedbug.data import FederatedDataset
from fedbug.errors import ConfigError, FedbugError, first_line


def check_model_fits(
    model: nn.Module, x: Tensor, y: Tensor, ds: FederatedDataset, task: Task
) -> None:
    """Refuse, before round 1, a model that does not fit the data: one forward pass of the
    batch ``x`` (prepared samples; labels ``y``), in eval mode without gradients and with the
    global random state put back. A layer that fails on its input is named with the sizes it
    takes and gets and the fix; an output the task cannot use (a class count other than the
    data set's) is named by the task (:meth:`~fedbug.core.tasks.Task.output_problem`)."""
    what = f"model {type(model).__name__} does not fit data set {ds.name!r}"
    if not any(True for _ in model.parameters()):
        raise ConfigError(
            f"model {type(model).__name__} has no parameters: nothing to train; give a model "
            "with trainable layers"
        )
    running: list[tuple[str, nn.Module, tuple[Any, ...]]] = []  # the layers entered, innermost last
    handles = []
    for name, module in model.named_modules():

        def enter(m: nn.Module, inputs: tuple[Any, ...], name: str = name) -> None:
            running.append((name, m, inputs))

        def leave(_m: nn.Module, _inputs: tuple[Any, ...], _output: Any) -> None:
            running.pop()

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    was_training = model.training
    try:
        model.eval()
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            output = model(x)
    except FedbugError:
        raise
    except Exception as e:
        name, module, inputs = running[-1] if running else ("", model, (x,))
        misfit = _layer_misfit(name, module, inputs, ds)
        if misfit is not None:
            raise ConfigError(f"{what}: {misfit}") from None
        where = f"its layer {name} ({type(module).__name__})" if name else "its forward pass"
        got = inputs[0] if inputs and isinstance(inputs[0], Tensor) else None
        taking = f" (given inputs of shape {_dims(got.shape)})" if got is not None and name else ""
        said = first_line(e, empty="")
        raise ConfigError(
            f"{what}: {where} fails on a batch of {len(x)} samples of shape "
            f"{_dims(ds.input_shape)}{taking}: {type(e).__name__}: {said}; make the model take "
            "samples of that shape"
        ) from e
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    problem = task.output_problem(output, y, ds.num_classes)
    if problem is not None:
        raise ConfigError(f"{what}: it {problem}")


def _dims(shape: Any) -> str:
    return "x".join(map(str, shape)) or "() (a scalar)"


def _layer_misfit(
    name: str, module: nn.Module, inputs: tuple[Any, ...], ds: FederatedDataset
) -> str | None:
    """What a standard layer that failed takes against what it got, with the fix; None when
    the layer is not one of these or the sizes agree (the failure is elsewhere)."""
    got = inputs[0] if inputs and isinstance(inputs[0], Tensor) else None
    if got is None or not name:
        return None
    layer = f"its layer {name} ({type(module).__name__})"
    samples = f"samples of shape {_dims(ds.input_shape)}"
    if isinstance(module, nn.Linear) and got.dim() and got.shape[-1] != module.in_features:
        n = got.shape[-1]
        return (
            f"{layer} takes {module.in_features} features but gets inputs of shape "
            f"{_dims(got.shape)} from {samples}; make it take {n} (nn.Linear({n}, "
            f"{module.out_features})), or give data of the shape the model expects"
        )
    conv = nn.modules.conv._ConvNd
    if isinstance(module, conv) and got.dim() >= 2 and got.shape[1] != module.in_channels:
        c, kind = got.shape[1], type(module).__name__
        return (
            f"{layer} takes {module.in_channels} channel(s) but gets inputs of shape "
            f"{_dims(got.shape)} from {samples}; make it take {c} (nn.{kind}({c}, "
            f"{module.out_channels}, ...)), or give data of the shape the model expects"
        )
    if isinstance(module, nn.Embedding) and got.numel():
        lo, hi = (int(v) for v in torch.aminmax(got.detach().long()))
        if lo < 0 or hi >= module.num_embeddings:
            n = module.num_embeddings
            return (
                f"{layer} takes token ids 0..{n - 1} but gets ids from {lo} to {hi} from "
                f"{samples} (inputs={ds.inputs!r}); give token ids in 0..{n - 1} "
                "(inputs='tokens'), or a model whose embedding covers the data's ids"
            )
    return None
