"""Sample-level differential privacy on the client: DP-SGD (Abadi et al. 2016) with Opacus's
per-sample gradients, on the units a step trains.

Each local step, every sample's gradient over the step's trainable parameters is clipped to L2
norm C (Opacus's flat clipping, factor min(1, C / (norm + 1e-6))), the clipped gradients summed,
N(0, (z C)^2) added to each trainable entry, and the result divided by the batch size: the
gradient the optimiser then steps with (the weight-only terms of FedProx, FedDyn and SCAFFOLD are
added after, as post-processing). Frozen units get neither per-sample gradients nor noise: Opacus
captures no activations for a module without trainable parameters, and this module's hooks skip
such a module's backward too, so a frozen block costs what it costs without DP.

Batches are Poisson samples by default (each sample in with probability q = batch_size / n, a
draw that can be empty: the step is then noise alone), what the accountant assumes; ``sampling:
shuffle`` keeps the usual shuffled fixed batches (Opacus's ``poisson_sampling=False``), and the
epsilon reported is then the Poisson figure, an approximation. The draws and the noise come from
a generator addressed by (seed, round, client), so every executor gives the same numbers.

What is protected is each client's data set: epsilon per client, after all the local steps it
took in rounds whose update reached the server (the probe steps of a restarted round included),
by dp-accounting's RDP accountant; the server records the largest over the clients so far.

Opacus serves the model or refuses it when the run is built (BatchNorm: use GroupNorm; an LSTM:
Opacus's DPLSTM); its per-sample gradients are checked against the batch gradient autograd
computes beside them the first time each set of units trains, so a layer Opacus models wrongly
(as its convolutions on NHWC activations were) stops the run with a reason instead of training
on wrong gradients. The check cannot see a loss that is not a sum over samples (the mean of
Opacus's per-sample gradients is the batch gradient whatever the loss): such losses are refused
with the config (``Algorithm.loss_per_sample``, ``extra_loss``).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from fedbug.core.device import from_host
from fedbug.core.protocol import SampleDP
from fedbug.errors import ConfigError

_MISSING = 'dp_sgd: needs Opacus: pip install "fedbug[dp]"'
_SUBSTITUTED = (
    "dp_sgd: the model runs its layers on substituted weights (functional_call: a width "
    "method's masked sub-model), which Opacus's per-sample hooks cannot follow; remove dp_sgd "
    "or use an algorithm that trains the model's own weights"
)


def _opacus() -> Any:
    try:
        import opacus
        import opacus.grad_sample
        import opacus.validators
    except ImportError:
        raise ConfigError(_MISSING) from None
    return opacus


def sample_dp(cfg: Any) -> SampleDP | None:
    """The client's DP-SGD settings from the config's ``dp_sgd:`` block (None without one)."""
    p = cfg.dp_sgd
    if p is None:
        return None
    _opacus()  # missing: one line naming the extra, before anything runs
    return SampleDP(clip=p.clip, noise_multiplier=p.noise_multiplier, sampling=p.sampling)


def refuse_unsupported(model: nn.Module) -> None:
    """One-line refusal of a model Opacus cannot compute per-sample gradients for, naming its
    modules Opacus's validator rejects and the fix."""
    validate = _opacus().validators.ModuleValidator.validate
    if not validate(model, strict=False):
        return
    named = [
        (name, type(m).__name__)
        for name, m in model.named_modules()
        if not any(True for _ in m.children()) and validate(m, strict=False)
    ]
    kinds = sorted({k for _, k in named}) or [type(model).__name__]
    where = ", ".join(f"{n} ({k})" for n, k in named[:3]) + (" ..." if len(named) > 3 else "")
    if any("BatchNorm" in k for k in kinds):
        fix = "use GroupNorm instead (opacus.validators.ModuleValidator.fix(model) swaps them)"
    elif any("LSTM" in k or "GRU" in k or k == "RNN" for k in kinds):
        fix = "use Opacus's drop-in opacus.layers.DPLSTM / DPGRU / DPRNN in the model"
    else:
        fix = "replace them as opacus.validators.ModuleValidator.fix(model) would"
    raise ConfigError(
        f"dp_sgd: Opacus cannot compute per-sample gradients of {', '.join(kinds)} "
        f"modules ({where or 'the model'}); {fix}"
    )


class PerSampleGradients:
    """Opacus's per-sample gradient hooks on a model, and the DP-SGD step's private gradient."""

    def __init__(self, model: nn.Module, params: SampleDP) -> None:
        hooks_cls = _frozen_aware_hooks()
        for p in model.parameters():  # hooks go on every module that has parameters
            p.requires_grad_(True)
        self.hooks = hooks_cls(model, batch_first=True, loss_reduction="mean", strict=False)
        self.modules = [m for m in model.modules() if any(True for _ in m.parameters(False))]
        self.params = params
        self.checked: set[tuple[int, ...]] = set()

    @property
    def poisson(self) -> bool:
        return self.params.sampling == "poisson"

    def poisson_batch(self, n: int, batch_size: int, generator: torch.Generator) -> Tensor:
        """A Poisson sample of ``range(n)``: each index in with probability min(1, B / n)."""
        q = min(1.0, batch_size / n)
        return torch.nonzero(torch.rand(n, generator=generator) < q).squeeze(1)

    def backward(self, loss: Tensor) -> None:
        """``loss.backward()``, the per-sample gradients captured on the way. (PyTorch warns
        that the first layer's full backward hook fires with no input requiring a gradient:
        the hook reads the layer's output gradient only, so the warning is silenced.)"""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss.backward()

    def clear(self) -> None:
        """Forget activations a forward pass without a backward left (and any stale samples)."""
        for m in self.modules:
            if hasattr(m, "activations"):
                # Opacus's list of captured inputs (torch types an unknown module attribute as
                # Tensor | Module)
                m.activations.clear()  # type: ignore[union-attr, operator]
            if hasattr(m, "max_batch_len"):
                del m.max_batch_len
            for p in m.parameters(False):
                p.grad_sample = None  # type: ignore[attr-defined]  # Opacus's, as below

    def privatize(
        self,
        trainable: list[tuple[nn.Parameter, Tensor]],
        batch_size: int,
        generator: torch.Generator,
        key: tuple[int, ...],
    ) -> None:
        """Write the private gradient into each trainable parameter's gradient view: the sum of
        the clipped per-sample gradients plus noise, over ``batch_size`` (the expected batch:
        the noise's scale must not depend on the draw). An empty batch gives noise alone."""
        clip, std = self.params.clip, self.params.noise_multiplier * self.params.clip
        # grad_sample: Opacus's hooks add it to each parameter at run time (torch's stub has no
        # such attribute)
        samples = [p.grad_sample for p, _ in trainable]  # type: ignore[attr-defined]
        if key not in self.checked and all(s is not None for s in samples):
            _check_against_batch_gradient(trainable, samples)
            self.checked.add(key)
        factor = _clip_factors(samples, clip)
        for (p, view), s in zip(trainable, samples):
            summed = torch.zeros_like(view) if s is None else torch.einsum("i,i...->...", factor, s)
            noise = torch.randn(view.shape, generator=generator) * std
            view.copy_((summed + from_host(noise, view.device)) / batch_size)
            p.grad_sample = None  # type: ignore[attr-defined]  # Opacus's, as above


def _clip_factors(samples: list[Tensor | None], clip: float) -> Tensor | None:
    """min(1, C / (||g_i|| + 1e-6)) per sample, ||g_i|| over every trainable parameter (None:
    no sample in the batch)."""
    present = [s for s in samples if s is not None]
    if not present or len(present[0]) == 0:
        return None
    norms = torch.stack([s.reshape(len(s), -1).norm(dim=1) for s in present], dim=1).norm(dim=1)
    return (clip / (norms + 1e-6)).clamp(max=1.0)


def _check_against_batch_gradient(
    trainable: list[tuple[nn.Parameter, Tensor]], samples: list[Tensor | None]
) -> None:
    """The mean of the per-sample gradients is the batch gradient: a layer Opacus models wrongly
    breaks this, and is refused with its shape named."""
    for (p, view), s in zip(trainable, samples):
        assert s is not None
        mean = s.mean(dim=0)
        scale = float(view.abs().max()) + 1e-8
        if not torch.allclose(mean, view, rtol=1e-3, atol=1e-4 * scale):
            raise ConfigError(
                f"dp_sgd: Opacus's per-sample gradients of a parameter of shape "
                f"{tuple(p.shape)} do not average to its batch gradient (a layer whose forward "
                "Opacus does not model); this model cannot run with dp_sgd"
            )


@functools.cache
def _frozen_aware_hooks() -> type:
    """Opacus's hooks, skipping the backward of a module whose parameters are frozen now (it
    captured no activations: Opacus would fail on it), so frozen units cost nothing extra."""
    base = _opacus().grad_sample.GradSampleHooks
    from opacus.utils.module_utils import requires_grad

    class FrozenAwareHooks(base):  # type: ignore[misc, valid-type]
        def capture_activations_hook(
            self, module: nn.Module, forward_input: Any, forward_output: Any
        ) -> None:
            if any(not isinstance(p, nn.Parameter) for p in module.parameters(False)):
                raise ConfigError(_SUBSTITUTED)
            # NCHW copies of channels_last inputs: Opacus 1.6's convolution grad sampler gives
            # zero per-sample gradients for NHWC activations (the check below caught it)
            dense = [t.contiguous() if isinstance(t, Tensor) else t for t in forward_input]
            super().capture_activations_hook(module, dense, forward_output)

        def capture_backprops_hook(self, module: nn.Module, *args: Any, **kwargs: Any) -> None:
            if not requires_grad(module):
                return
            super().capture_backprops_hook(module, *args, **kwargs)

    return FrozenAwareHooks
