"""FedROD (Chen & Chao 2022), as PFLlib implements it (REFERENCE.md).

The model gets a *personal head*: a copy of the classifier (the last layer the forward pass
calls), initialised as a copy of the generic head, fed the classifier's input *detached*. With
h the representation, z_g the model's (generic) logits and z_p = personal_head(h.detach()):

* generic part (base + generic head) trained with the balanced softmax
  CE(z_g + log n, y), n_c = the number of this client's training samples of class c
  (log 0 = -inf: an absent class gets probability 0 and gradient exactly 0);
* personal head trained with CE(z_g.detach() + z_p, y);
* prediction (``logits``) z_g + z_p.

The training loss is the sum of the two; since the personal term sees only detached tensors its
gradient reaches only the personal head and the generic term's never does, so one SGD step on the
sum is PFLlib's two steps (generic optimiser, then the head's own ``opt_head``) computed from the
same forward pass. One optimiser over all parameters is the same as a separate one for the
personal head because SGD (and Adam, momentum) is per-parameter, with two differences from
PFLlib's plain-SGD ``opt_head``: the config's weight decay and momentum apply to the personal
head too, and ``clip_grad_norm`` clips the joint norm of both parts.

The base and generic head are shared and averaged; the personal head is local (``local.<unit>`` in
the client's state; the initial copy until the client is first selected). The server's model,
base + generic head, is a global model (the generic-FL model of the paper): the wrapper's forward
returns z_g as a tensor, so the plain evaluator scores the generic model, and carries z_p on it
(``output.personal_logits``) for :meth:`FedROD.loss` and :meth:`FedROD.logits` (what the
personalized evaluation uses).

Unit names gain a ``model.`` prefix (``units: [model.conv1, ...]`` in a config) and the personal
head is the last unit, an *extra* unit of the layout (neither base nor head).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fedbug.algorithms.base import ALGORITHMS, ClientSession
from fedbug.algorithms.bodyhead import BodyHead
from fedbug.core.device import from_host
from fedbug.core.units import wrapped_units


class PersonalHeadModel(nn.Module):
    """``model`` plus ``personal_head``, a copy of its classifier fed the classifier's input,
    detached. forward returns the model's logits with the personal logits attached."""

    def __init__(self, model: nn.Module, classifier: str) -> None:
        super().__init__()
        self.model = model
        self.classifier = classifier
        self.personal_head = copy.deepcopy(model.get_submodule(classifier))

    def fedbug_units(self) -> list[str | list[str]] | None:
        # None (traced): the personal head is called last, so it is the last unit
        return wrapped_units(self, self.model, FedROD.extra_modules)

    def forward(self, *args: Any) -> Tensor:
        seen: list[Tensor] = []

        def grab(_m: nn.Module, inputs: tuple[Tensor, ...]) -> None:
            seen.append(inputs[0])

        handle = self.model.get_submodule(self.classifier).register_forward_pre_hook(grab)
        try:
            z_g = self.model(*args)
        finally:
            handle.remove()
        z_g.personal_logits = self.personal_head(seen[-1].detach())
        return z_g


def balanced_softmax_loss(z: Tensor, y: Tensor, counts: Tensor) -> Tensor:
    """Mean CE(z + log n, y) with log 0 = -inf, masked so absent classes get zero gradient
    (never NaN). Every label in ``y`` must have n_y > 0."""
    present = counts > 0
    adjusted = z + counts.clamp(min=1).to(z.dtype).log()
    adjusted = adjusted.masked_fill(~present, float("-inf"))
    return F.cross_entropy(adjusted, y)


@ALGORITHMS.register("fedrod")
class FedROD(BodyHead):
    name = "fedrod"
    loss_per_sample = False  # the loss reads the client's class counts / classes present
    has_global_model = True
    extra_modules = ("personal_head",)

    def wrap_model(
        self, model: nn.Module, classifier: str, order: Sequence[str] | None = None
    ) -> nn.Module:
        return PersonalHeadModel(model, classifier)

    def shared_units(self, num_units: int) -> tuple[int, ...]:
        return self._check(num_units).model_units

    def local_units(self, num_units: int) -> tuple[int, ...]:
        return self._check(num_units).extra

    @classmethod
    def check_config(cls, cfg: Any) -> str | None:
        if cfg.task != "classification":
            return (
                f"fedrod trains its generic head with the balanced softmax over classes; it "
                f"needs task: classification, not {cfg.task}"
            )
        return None

    def start_client(self, task: Any, labels: Tensor, runtime: Any = None, gen: Any = None) -> Any:
        return FedRODClient(self, task, labels)

    def loss(self, output: Any, y: Tensor, counts: Tensor | None = None) -> Tensor:
        """Balanced softmax on the generic logits (``counts``: the client's n_c; None: counted
        from ``y``) plus the personal head's CE."""
        z_g, z_p = output, output.personal_logits
        if counts is None:
            counts = class_counts(y, z_g.shape[-1])
        generic = balanced_softmax_loss(z_g, y, counts.to(z_g.device))
        personal = F.cross_entropy(z_g.detach() + z_p, y)
        return generic + personal

    def logits(self, output: Any) -> Tensor:
        return output + output.personal_logits


def class_counts(labels: Tensor, num_classes: int) -> Tensor:
    """n_c over ``num_classes`` classes."""
    return torch.bincount(labels.reshape(-1).long(), minlength=num_classes)


class FedRODClient(ClientSession):
    """One client's round: its class counts n_c, counted once from its training labels."""

    alg: FedROD

    def __init__(self, alg: FedROD, task: Any, labels: Tensor) -> None:
        super().__init__(alg, task, labels)
        self.counts: Tensor | None = None

    def loss(self, output: Any, y: Tensor) -> Tensor:
        num_classes = output.shape[-1]
        if self.counts is None or len(self.counts) != num_classes:
            # counted on the host from its labels, moved once (a step's .to would wait)
            self.counts = from_host(class_counts(self.labels, num_classes), output.device)
        return self.alg.loss(output, y, self.counts)
