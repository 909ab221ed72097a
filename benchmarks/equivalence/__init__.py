"""Differential harness: fedbug against the FedBug authors' code, PFLlib and FL-bench on the same
inputs (README.md: how to run; RESULTS.md: what was compared and found)."""
