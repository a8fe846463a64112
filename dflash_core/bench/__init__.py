"""One measurement: the benchmark session, paired rounds, cases, calibration, the cost model, the selection of
the fastest, mechanism activity, peer rows and the one statistics module the report reads."""
