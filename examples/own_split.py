"""Your own per-client split: each client's samples as you hold them (arrays or a torch
Dataset), used as they are (``partition: natural``), with the built-in classification task.

    python examples/own_split.py                 # a few seconds on a CPU
"""

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

import fedbug


def client(rng: np.random.Generator, classes: list[int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """n samples of the given classes: 2-D points around one center per class."""
    centers = np.array([[0.0, 3.0], [3.0, 0.0], [-3.0, 0.0], [0.0, -3.0]])
    y = rng.choice(classes, size=n)
    return (centers[y] + rng.normal(size=(n, 2))).astype(np.float32), y


def main() -> None:
    rng = np.random.default_rng(0)
    split = [client(rng, [0, 1], 60), client(rng, [1, 2], 80), client(rng, [2, 3], 50)]
    x4, y4 = client(rng, [3, 0], 70)
    clients = [*split, TensorDataset(torch.from_numpy(x4), torch.from_numpy(y4))]
    test = client(rng, [0, 1, 2, 3], 200)
    data = fedbug.FederatedDataset.from_clients("points", clients, test=test, scale=1.0)
    cfg = fedbug.config(
        partition="natural",
        num_clients=4,
        clients_per_round=2,
        rounds=10,
        local_epochs=2,
        batch_size=16,
        lr=0.1,
        count_flops=False,
    )
    # a factory (or a class) is called under the run's seed: the same numbers every run
    result = fedbug.run(
        cfg,
        model=lambda: nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 4)),
        dataset=data,
    )
    sizes = [len(p) for p in data.natural_clients or []]
    print(f"clients hold {sizes} samples; test accuracy {100 * result.summary['final_acc']:.1f}%")
    assert result.summary["final_acc"] > 0.6


if __name__ == "__main__":
    main()
