"""Every rule the lab uses to compare rounds, methods and runs (numpy/scipy only; nothing above this floor):

* `summary`: one case (quartiles, order-statistic intervals of a median, one-sided limits for goals) and one run's
  noise figure;
* `medians`: the one bootstrap of a median that every "A differs from B" rule draws from;
* `selection`: the fastest method with its guarantee (MCB), read by the ranking;
* `change`: one case between two runs with a joint interval, read by the gate and the comparison page.
"""
