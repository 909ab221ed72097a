"""Where the cohort executor's GPU numbers part from the sequential executor's, and why.

``tests/test_cuda.py`` holds the cohort executor within 1e-4 of the sequential one over a round
on the GPU. This prints that gap beside the sequential executor's own GPU-against-CPU gap for
the same round, and the cohort gap again with cuDNN off (PyTorch's native convolutions) and with
autotuned kernels: when the cohort gap falls to the sequential one's size without cuDNN, it is
the grouped convolutions' algorithm (cuDNN rounds differently for them), not the executor.

    python -m benchmarks.gpu.cohort_gap
"""

from __future__ import annotations

import json
from typing import Any

import torch

import fedbug
from fedbug.config import load_config
from fedbug.data import FederatedDataset
from fedbug.engine.experiment import ClientSide


def random_images(seed: int = 0) -> FederatedDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (2000, 3, 32, 32), dtype=torch.uint8, generator=g)
    xt = torch.randint(0, 256, (500, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (2000,), generator=g)
    yt = torch.randint(0, 10, (500,), generator=g)
    mean, std = (0.49, 0.48, 0.45), (0.25, 0.24, 0.26)
    return FederatedDataset("random-cifar", x, y, xt, yt, 10, mean=mean, std=std)


def config(**over: Any) -> Any:
    doc = {
        "name": "gap", "model": "standard_cnn", "num_clients": 10, "clients_per_round": 3,
        "rounds": 1, "local_steps": 2, "batch_size": 50, "policy": "bottom_up",
        "count_flops": False, "device": "cuda", **over,
    }  # fmt: skip
    return load_config(None, doc=doc)


def apart(a: torch.Tensor, b: torch.Tensor, w0: torch.Tensor) -> float:
    return float((a.double().cpu() - b.double().cpu()).norm() / (a.double().cpu() - w0).norm())


def main() -> None:
    ds = random_images()
    out: dict[str, Any] = {}
    for name, over in {
        "sgd": {},
        "scaffold-momentum": {"algorithm": "scaffold", "momentum": 0.9},
        "adam": {"optimizer": "adam", "lr": 0.001},
    }.items():
        w0 = ClientSide(config(device="cpu", **over), dataset=ds).initial_weights().double()
        cpu = fedbug.run(config(device="cpu", **over), dataset=ds).weights
        seq = fedbug.run(config(**over), dataset=ds).weights
        coh = fedbug.run(config(executor="cohort", **over), dataset=ds).weights
        row = {
            "sequential GPU - CPU": apart(seq, cpu, w0),
            "cohort GPU - CPU": apart(coh, cpu, w0),
            "cohort GPU - sequential GPU": apart(coh, seq, w0),
        }
        auto = config(executor="cohort", deterministic=False, **over)
        row["cohort autotuned - sequential GPU"] = apart(
            fedbug.run(auto, dataset=ds).weights, seq, w0
        )
        cont = config(executor="cohort", memory_format="contiguous", **over)
        row["cohort NCHW - sequential GPU"] = apart(fedbug.run(cont, dataset=ds).weights, seq, w0)
        torch.backends.cudnn.enabled = False
        try:
            seq_n = fedbug.run(config(**over), dataset=ds).weights
            coh_n = fedbug.run(config(executor="cohort", **over), dataset=ds).weights
        finally:
            torch.backends.cudnn.enabled = True
        row["no cuDNN: sequential GPU - CPU"] = apart(seq_n, cpu, w0)
        row["no cuDNN: cohort GPU - CPU"] = apart(coh_n, cpu, w0)
        row["no cuDNN: cohort - sequential"] = apart(coh_n, seq_n, w0)
        out[name] = row
        print(name, json.dumps({k: f"{v:.1e}" for k, v in row.items()}), flush=True)
    flags = {
        "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn.deterministic": torch.backends.cudnn.deterministic,
    }
    print("flags after the runs", flags)


if __name__ == "__main__":
    main()
