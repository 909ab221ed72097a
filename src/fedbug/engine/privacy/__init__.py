"""Differential privacy in a run: client-level DP-FedAvg (``dp:``, :mod:`.client_level`: each
update clipped, the sum noised at the server), sample-level DP-SGD (``dp_sgd:``,
:mod:`.sample_level`: per-sample gradients clipped and noised on the client, each client's
spend counted at the server by :mod:`.sample_server`), and their privacy accounting
(:mod:`.accountant`). Their config checks live in :mod:`fedbug.config.dp`."""
