"""A run's plot: test accuracy and train loss against round; :func:`metric_axis`, the axis label
and scale of a record key for every plot."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from fedbug.results.files import atomic_write_bytes

#: words for the parts of a record key (test_acc -> test accuracy, test_r2 -> test R²)
_WORDS = {"acc": "accuracy", "r2": "R²", "mse": "MSE", "mae": "MAE", "f1": "F1", "ft": "FT"}
#: record keys whose parts read better in another order
_NAMES = {
    "acc_client_mean": "client mean accuracy",
    "acc_client_weighted": "client weighted accuracy",
    "acc_client_std": "client accuracy sd",
    "acc_after_ft": "accuracy after fine-tuning",
}


def metric_axis(key: str) -> tuple[str, float]:
    """The axis label of a record key and the factor its values are drawn at: accuracies (a
    part ``acc``) as percent, ``("test accuracy (%)", 100)``; the rest as recorded, their parts
    in words (``test_r2`` -> ``("test R²", 1)``, ``round_length`` -> ``("round length", 1)``)."""
    parts = key.split("_")
    prefix = ""
    if parts[0] == "test" and len(parts) > 1:
        prefix, parts = "test ", parts[1:]
    rest = "_".join(parts)
    words = _NAMES.get(rest) or " ".join(_WORDS.get(p, p) for p in parts)
    if "acc" in parts:
        return f"{prefix}{words} (%)", 100
    return f"{prefix}{words}", 1


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
    for ax in (ax1, ax2):  # rounds are whole numbers: no tick at 2.5
        ax.xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(title)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
