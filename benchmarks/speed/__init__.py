"""Workload W: fedbug's engine against a bare PyTorch loop, and the speed levers (README.md)."""
