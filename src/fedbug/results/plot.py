"""A run's plot: test accuracy and train loss against round."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from fedbug.results.files import atomic_write_bytes


def plot_run(records: list[dict[str, Any]], path: Path, title: str) -> None:
    """Test accuracy and train loss against round, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ev = [r for r in records if r.get("test_acc") is not None]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.plot([r["round"] for r in ev], [100 * r["test_acc"] for r in ev], marker=".")
    ax1.set_xlabel("round")
    ax1.set_ylabel("test accuracy (%)")
    ax1.grid(alpha=0.3)
    trained = [r for r in records if r.get("train_loss") is not None]
    ax2.plot([r["round"] for r in trained], [r["train_loss"] for r in trained], color="C1")
    ax2.set_xlabel("round")
    ax2.set_ylabel("mean train loss")
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
