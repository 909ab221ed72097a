"""Reports of finished runs: the ``fedbug report`` command (runs), FreezeFL Table III and
Figs. 3-4 (freezefl), the folder a report writes (out_folder), FedSeq Table 4 (table4), the
training cost of freezing (cost), the two-client analysis (theory), thinned curves (thin), mean
and spread (spread)."""
