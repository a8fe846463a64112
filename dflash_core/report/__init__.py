"""The canonical report: pytest-benchmark JSON -> benchmark.json, report.html, index.html."""
