"""What Flower costs over the same run in-process: the simulation runtime and a loopback
deployment (README.md)."""
