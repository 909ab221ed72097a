"""A partition as a clients x classes dot plot (FedSeq's Fig. 3): dot area = samples.

With per-client test sets a second panel shows them the same way, so a reader sees at a glance
whether each client's test classes follow its train classes.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from torch import Tensor

from fedbug.results import atomic_write_bytes

#: Clients drawn at most; a larger partition shows its first clients and says so in the title.
MAX_PLOTTED_CLIENTS = 200


def _counts(parts: list[Tensor], labels: Tensor, num_classes: int) -> np.ndarray:
    """Clients x classes sample counts."""
    y = np.asarray(labels.detach().cpu() if isinstance(labels, Tensor) else labels, np.int64)
    out = np.zeros((len(parts), num_classes), dtype=np.int64)
    for i, p in enumerate(parts):
        idx = np.asarray(p, dtype=np.int64).reshape(-1)
        if idx.size:
            out[i] = np.bincount(y[idx], minlength=num_classes)[:num_classes]
    return out


def plot_partition(
    parts: list[Tensor],
    labels: Tensor,
    num_classes: int,
    path: Path | str,
    title: str,
    test_parts: list[Tensor] | None = None,
    test_labels: Tensor | None = None,
) -> None:
    """Write a PNG of clients (x) against classes (y), dot area proportional to the samples.

    ``parts[i]`` indexes ``labels``; ``test_parts[i]`` (optional) indexes ``test_labels``, drawn
    in a second panel on its own scale. Only the first :data:`MAX_PLOTTED_CLIENTS` clients are
    drawn. The file is written atomically (matplotlib's Agg backend, no display needed).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if test_parts is not None and test_labels is None:
        raise ValueError("test_parts needs test_labels")
    num_clients = len(parts)
    shown = min(num_clients, MAX_PLOTTED_CLIENTS)
    panels = [("train", _counts(parts[:shown], labels, num_classes))]
    if test_parts is not None and test_labels is not None:  # (test_parts alone: refused above)
        panels.append(("test", _counts(test_parts[:shown], test_labels, num_classes)))
    width = min(max(4.0, 0.12 * shown + 1.5), 20.0)
    height = min(max(3.0, 0.12 * num_classes + 1.2), 14.0)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(width * len(panels), height), squeeze=False, sharey=True
    )
    # The largest dot about fills one client x class cell (in points^2).
    cell = min(72 * (width - 1.2) / max(shown, 1), 72 * (height - 1.0) / max(num_classes, 1))
    for ax, (name, counts) in zip(axes[0], panels, strict=True):
        client, cls = np.nonzero(counts)
        n = counts[client, cls]
        top = int(counts.max()) if counts.size else 0
        if top:
            ax.scatter(client, cls, s=n / top * (0.95 * cell) ** 2, c="C0", alpha=0.7, lw=0)
        ax.set_xlim(-0.7, shown - 0.3)
        ax.set_ylim(-0.7, num_classes - 0.3)
        ax.set_xlabel("client")
        ax.set_title(f"{name}: {int(counts.sum())} samples, largest dot {top}", fontsize=9)
        ax.grid(alpha=0.2)
    axes[0][0].set_ylabel("class")
    more = f" (first {shown} of {num_clients} clients)" if shown < num_clients else ""
    fig.suptitle(title + more, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())
