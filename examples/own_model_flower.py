"""Your own model on Flower's simulation runtime: the nodes build it from the config, so it is
named by its import path (``model: "own_model_flower:DigitsNet"``: this file's class); the same
config in this process gives the same numbers.

    pip install "fedbug[flower]"
    python examples/own_model_flower.py          # about a minute on a CPU (Flower's start-up)
"""

import sys
import tempfile
from pathlib import Path

from torch import nn

import fedbug


class DigitsNet(nn.Module):
    """A small classifier of the 8x8 digits; ``width`` comes from ``model_options``."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU())
        self.classifier = nn.Linear(width, 10)

    def forward(self, x):
        return self.classifier(self.features(x))


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # this file, importable by name
    cfg = fedbug.config(
        dataset="digits",  # embedded: every machine has it
        model="own_model_flower:DigitsNet",
        model_options={"width": 32},
        num_clients=4,
        clients_per_round=4,
        rounds=3,
        local_epochs=1,
        batch_size=32,
        lr=0.1,
        policy="bottom_up",
        threads=1,
        count_flops=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        here = fedbug.run(cfg, Path(tmp) / "here")
        there = fedbug.run(
            cfg.model_copy(update={"executor": "flower-simulation"}), Path(tmp) / "flower"
        )
    a, b = here.summary, there.summary
    print(f"in this process: {100 * a['final_acc']:.2f}%; on Flower: {100 * b['final_acc']:.2f}%")
    same = a["weights_sha256"] == b["weights_sha256"]
    print(f"model class {b['model_class']}, the same final weights: {same}")
    assert a["weights_sha256"] == b["weights_sha256"]


if __name__ == "__main__":
    main()
