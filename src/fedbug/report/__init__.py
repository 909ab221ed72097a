"""Reports of finished runs: tables and plots of runs and sweeps (runs), FedSeq Table 4
(table4), the training cost of freezing (cost), the two-client analysis (theory), thinned
curves (thin), mean and spread (spread)."""
