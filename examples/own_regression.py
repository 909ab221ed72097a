"""Your own model, data and loss: a small regression network trained with FedProx and FedBug's
bottom-up gradual unfreezing on 8 clients holding parts of a synthetic linear problem.

    python examples/own_regression.py            # a few seconds on a CPU
"""

import numpy as np
import torch
from torch import nn

import fedbug


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(5, 32), nn.Tanh(), nn.Linear(32, 16), nn.Tanh())
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def mse(output: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return ((output - y) ** 2).mean()


def main() -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=(5, 1))
    x, xt = rng.normal(size=(800, 5)), rng.normal(size=(200, 5))
    y, yt = x @ w + 0.1 * rng.normal(size=(800, 1)), xt @ w
    data = fedbug.FederatedDataset(
        "linear5", x, y, xt, yt, num_classes=1, scale=1.0, labels="values", inputs="vector"
    )
    cfg = fedbug.config(
        algorithm="fedprox",
        fedprox={"mu": 0.01},
        policy="bottom_up",
        bottom_up={"gu_ratio": 0.4},
        partition="iid",
        num_clients=8,
        clients_per_round=4,
        rounds=15,
        local_steps=10,
        batch_size=25,
        lr=0.05,
        weight_decay=0.0,
        count_flops=False,
    )
    # a user loss: the headline is the test loss; task="regression" would report MSE, MAE, R^2
    result = fedbug.run(cfg, model=Net, dataset=data, loss=mse)
    first, last = result.records[0]["test_loss"], result.records[-1]["test_loss"]
    print(f"test MSE {first:.3f} after round 1, {last:.3f} after round {cfg.rounds}")
    assert last < first


if __name__ == "__main__":
    main()
