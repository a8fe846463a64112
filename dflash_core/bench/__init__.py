"""One measurement: the benchmark session, paired rounds, cases, calibration, the cost model, racing,
mechanism activity, peer rows and the one statistics module the report reads."""
