"""A causal LM's training targets at every position (``targets: every``)."""

from __future__ import annotations

import copy

import torch
from torch import Tensor

from fedbug.data.base import FederatedDataset
from fedbug.errors import ConfigError

#: the fix named where a model scores one position only under ``targets: every``
ONE_POSITION_FIX = (
    "targets: every: a model that scores every position, such as model: hf; or targets: last"
)


def every_position_targets(ds: FederatedDataset) -> FederatedDataset:
    """``ds`` with each training sample's target at every position: the token after each
    position of its window, that is the window shifted by one and then the sequence's own
    target (``x[1:] + [y]``), shape (N, T). Stored in the tokens' own type (every token id fits
    it: the targets are token ids too), so the targets take as much memory as the windows; the
    task casts a batch's to int64. The test set keeps one target a sequence."""
    if ds.inputs != "tokens" or ds.train_x.dim() != 2 or ds.labels != "classes":
        raise ConfigError(
            f"targets: every predicts the token after each position of a token sequence; data "
            f"set {ds.name!r} holds {ds.inputs} inputs of shape {tuple(ds.train_x.shape[1:])}; "
            "use a token data set (inputs='tokens', such as shakespeare) or targets: last"
        )
    x = ds.train_x
    kind = x.dtype if ds.num_classes - 1 <= torch.iinfo(x.dtype).max else torch.int64
    out = copy.copy(ds)  # the same data set, its training targets replaced
    out.train_y = next_tokens(x.to(kind), ds.train_y.to(kind))
    return out


def next_tokens(x: Tensor, y: Tensor) -> Tensor:
    """Each window's token after every position: the window ``x`` (N, T) shifted by one, then
    the sequence's own target ``y`` (N,); (N, T)."""
    return torch.cat([x[:, 1:], y.unsqueeze(1)], dim=1)
