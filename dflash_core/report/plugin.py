"""pytest plugin that will turn saved pytest-benchmark JSON into the canonical report.

Every pytest_benchmark_* hook here is declared optionalhook=True so the plugin loads even when
pytest-benchmark is disabled (-p no:benchmark).
"""

from __future__ import annotations
