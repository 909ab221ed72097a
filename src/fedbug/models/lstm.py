"""LEAF's Shakespeare model: a character embedding, two stacked LSTM layers and a classifier.

LEAF (``models/shakespeare/stacked_lstm.py``) and the FedAvg paper (McMahan et al., 2017):
Embedding(vocabulary, 8), two LSTM layers of 256 units, and a dense layer on the last time
step's output, predicting the next character. FreezeFL (Table I, Sec. V-A) trains this RNN on
Shakespeare and counts the two LSTM layers as two layers, so they are two separate single-layer
``nn.LSTM`` modules here and the model has four units: ``embedding``, ``lstm1``, ``lstm2``,
``fc``. (PyTorch's LSTM has two bias vectors per layer where TensorFlow's has one, so a layer
has ``4 * (h * (in + h) + 2h)`` parameters, ``4h`` more than LEAF's.)
"""

from __future__ import annotations

from torch import Tensor, nn


class ShakespeareLSTM(nn.Module):
    """Embedding(vocab, 8) - LSTM 256 - LSTM 256 - Linear(256, classes) on the last step.

    Input: int64 token ids [N, L] (LEAF: L = 80); output: logits [N, num_classes].
    ``vocab_size`` defaults to ``num_classes`` (LEAF's 80 symbols are both).
    """

    def __init__(
        self,
        input_shape: tuple[int, ...],
        num_classes: int,
        embed_dim: int = 8,
        hidden: int = 256,
        vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        if len(input_shape) != 1 or input_shape[0] < 1:
            raise ValueError(
                f"shakespeare_lstm needs token sequences (L,), e.g. (80,); got {input_shape}"
            )
        self.embedding = nn.Embedding(vocab_size or num_classes, embed_dim)
        self.lstm1 = nn.LSTM(embed_dim, hidden, batch_first=True)
        self.lstm2 = nn.LSTM(hidden, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.embedding(x.long())
        h, _ = self.lstm1(h)
        h, _ = self.lstm2(h)
        return self.fc(h[:, -1])
