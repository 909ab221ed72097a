"""Run fedbug's experiments on Flower (``pip install "fedbug[flower]"``).

fedbug keeps the round loop: the ServerApp (:mod:`fedbug.integrations.flower.serverapp`) runs the
unchanged
engine with a :class:`~fedbug.integrations.flower.executor.FlowerExecutor`, which sends each
selected client
one TRAIN message and turns the replies back into client results; the ClientApp
(:mod:`fedbug.integrations.flower.clientapp`) calls the same client function as the in-process
executor.
Flower only carries messages, so a config gives the same numbers in-process and on Flower.

Nothing here imports ``flwr`` at import time except the app modules; :func:`require_flower`
turns a missing install into one message.
"""

from __future__ import annotations

import warnings

from fedbug.errors import ConfigError

INSTALL_HINT = 'pip install "fedbug[flower]"'


def require_flower(what: str = "a Flower executor") -> None:
    """Raise one :class:`ConfigError` naming the install when ``flwr`` is missing."""
    try:
        with warnings.catch_warnings():  # flwr's own dependencies' deprecation notices
            warnings.simplefilter("ignore", DeprecationWarning)
            import flwr  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"{what} needs Flower, which is not installed; install it with {INSTALL_HINT}"
        ) from None
