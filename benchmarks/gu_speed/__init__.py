"""GU ratio vs per-batch local-training time, the FedBug paper's Figure 6 (README.md)."""
