"""Scoring a reconstruction against the true inputs (which the attacker never sees): PSNR and
SSIM from scikit-image (the ``privacy`` extra, imported lazily), label recovery, and a picture
grid of true over reconstructed images."""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
from torch import Tensor

from fedbug.errors import ConfigError

EXTRA_HINT = "the attack's scores need scikit-image: pip install 'fedbug[privacy]'"


def _skimage_metrics() -> Any:
    try:
        from skimage import metrics
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ConfigError(EXTRA_HINT) from e
    return metrics


def _as_numpy(images: Tensor) -> np.ndarray:
    """``N, C, H, W`` images as ``N, H, W, C`` float64 arrays."""
    return images.detach().to(torch.float64).permute(0, 2, 3, 1).cpu().numpy()


def match_order(true: Tensor, found: Tensor) -> Tensor:
    """The order of ``found`` that pairs each true image with a distinct reconstruction at the
    least total squared error (an update does not say which of its images is which); the
    assignment is SciPy's (a dependency of scikit-learn)."""
    from scipy.optimize import linear_sum_assignment

    cost = torch.cdist(true.flatten(1).double(), found.flatten(1).double()) ** 2
    _, cols = linear_sum_assignment(cost.numpy())
    return torch.as_tensor(cols, dtype=torch.long)


def image_scores(true: Tensor, found: Tensor) -> list[dict[str, float]]:
    """Per image (``N, C, H, W``, matched in order): PSNR and SSIM of the reconstruction,
    clamped to the true images' value range, which is also the data range of both scores."""
    metrics = _skimage_metrics()
    lo, hi = float(true.min()), float(true.max())
    rng = max(hi - lo, 1e-12)
    t, f = _as_numpy(true), _as_numpy(found.clamp(lo, hi))
    side = min(t.shape[1], t.shape[2])
    win = min(7, side if side % 2 else side - 1)
    out = []
    for a, b in zip(t, f):
        psnr = metrics.peak_signal_noise_ratio(a, b, data_range=rng)
        ssim = metrics.structural_similarity(a, b, data_range=rng, channel_axis=-1, win_size=win)
        out.append({"psnr": float(min(psnr, 100.0)), "ssim": float(ssim)})
    return out


def label_recovery(true: Tensor, found: Tensor) -> float:
    """The share of labels recovered, compared as multisets (a batch's order is unknown)."""
    t = torch.bincount(true.flatten(), minlength=int(max(true.max(), found.max())) + 1)
    f = torch.bincount(found.flatten(), minlength=len(t))
    return float(torch.minimum(t, f[: len(t)]).sum()) / max(1, true.numel())


#: images a row of the attack's grid holds; a larger batch wraps onto more pairs of rows
GRID_COLUMNS = 10


def save_grid(true: Tensor, found: Tensor, path: Path | BinaryIO) -> None:
    """A PNG: the true images in a row, their reconstructions in the row below, at most
    :data:`GRID_COLUMNS` a row (a batch of 68 was one row 9,520 pixels wide), each scaled to
    the true images' range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = true.shape[0]
    cols = min(n, GRID_COLUMNS)
    blocks = -(-n // cols)
    lo, hi = float(true.min()), float(true.max())
    fig, axes = plt.subplots(2 * blocks, cols, figsize=(1.4 * cols, 3 * blocks), squeeze=False)
    for b in range(blocks):
        for row, (name, imgs) in enumerate((("true", true), ("reconstructed", found))):
            for j in range(cols):
                ax, i = axes[2 * b + row][j], b * cols + j
                ax.set_xticks([])
                ax.set_yticks([])
                if i >= n:
                    ax.axis("off")
                    continue
                img = _as_numpy(imgs[i : i + 1].clamp(lo, hi))[0]
                gray = img[..., 0] if img.shape[-1] == 1 else (img - lo) / (hi - lo)
                ax.imshow(gray, cmap="gray")
            axes[2 * b + row][0].set_ylabel(name)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
