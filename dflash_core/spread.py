"""The one median and spread (IQR) every measurement in the lab reports: benchmark rows and calibration tables.

Quartiles are the standard library's `statistics.quantiles(..., method="inclusive")`: linear interpolation
between order statistics (Hyndman-Fan type 7, numpy.percentile's default), so an IQR in the report and one
in a calibration table mean the same thing and can be recomputed with numpy.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def median_iqr(xs: Sequence[float]) -> tuple[float, float]:
    """(median, Q3 - Q1) of `xs`; (0, 0) for no data and (x, 0) for one value (no spread is measured)."""
    if not xs:
        return 0.0, 0.0
    if len(xs) == 1:
        return float(xs[0]), 0.0
    q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return statistics.median(xs), q3 - q1
