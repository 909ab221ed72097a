"""Many runs: sweeps over a grid of configs and seeds, and the worker processes that run them at
once."""
