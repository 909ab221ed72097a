"""Gradients of the TwoLayer model worked by hand (numpy, no autograd)."""

from __future__ import annotations

import numpy as np


def unpack(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return w[0:4].reshape(2, 2), w[4:6], w[6:10].reshape(2, 2), w[10:12]


def ce_grad(w: np.ndarray, x: list[float], y: int) -> np.ndarray:
    """d CE(softmax(W2 (W1 x + b1) + b2), y) / d(W1, b1, W2, b2), flattened like the model."""
    w1, b1, w2, b2 = unpack(np.asarray(w, dtype=np.float64))
    x = np.asarray(x, dtype=np.float64)
    h = w1 @ x + b1
    z = w2 @ h + b2
    p = np.exp(z - z.max())
    p /= p.sum()
    dz = p.copy()
    dz[y] -= 1.0
    dw2 = np.outer(dz, h)
    dh = w2.T @ dz
    dw1 = np.outer(dh, x)
    return np.concatenate([dw1.ravel(), dh, dw2.ravel(), dz])


W0 = [0.3, -0.2, 0.1, 0.4, 0.05, -0.1, 0.2, 0.5, -0.3, 0.1, 0.0, 0.2]
