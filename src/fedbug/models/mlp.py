"""A multilayer perceptron on flattened input: one unit per linear layer."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from torch import Tensor, nn

from fedbug.models.size import MAX_LAYERS


class MLP(nn.Module):
    """Linear layers of the given hidden widths with ReLU between, then the classifier."""

    def __init__(
        self, input_shape: tuple[int, ...], num_classes: int, hidden: Sequence[int] = (64, 32)
    ) -> None:
        super().__init__()
        widths = [prod(input_shape), *_hidden_widths(hidden)]
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.classifier = nn.Linear(widths[-1], num_classes)
        self.act = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        x = x.flatten(1)
        for layer in self.hidden:
            x = self.act(layer(x))
        return self.classifier(x)


def _hidden_widths(hidden: Sequence[int]) -> list[int]:
    """``hidden`` checked: at most :data:`~fedbug.models.size.MAX_LAYERS` widths, each a whole
    number of at least 1 (a width of 0 built a layer that passes nothing on)."""
    widths = list(hidden)
    if len(widths) > MAX_LAYERS:
        raise ValueError(
            f"model_options.hidden: {len(widths)} layers, over fedbug's limit of {MAX_LAYERS:,} "
            "a model built from a config may have; use fewer"
        )
    bad = next((w for w in widths if isinstance(w, bool) or not isinstance(w, int) or w < 1), None)
    if bad is not None:
        raise ValueError(
            f"model_options.hidden: each width a whole number of at least 1, not {bad!r}"
        )
    return widths
