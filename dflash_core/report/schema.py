"""The report's input documents checked once, at load, against their JSON Schemas (jsonschema): a canonical
`benchmark.json` (benchmark.schema.json, docs/report-schema.md) and the parts of a saved run the report reads
(saved.schema.json). Why at load: every later reader (the pages, the cost model, the gate, the model card) then
meets only the types it expects, so a string where an object belongs is one `error:` line naming the field, not a
traceback deep in a renderer (whose exit 1 read as "regression found")."""

from __future__ import annotations

import json
from functools import cache
from importlib.resources import files
from typing import Any

import jsonschema

from ..errors import ReportInputError

REBUILD = "rebuild it with python -m dflash_core.report SAVED"
RERUN = "pass a run as pytest-benchmark saved it (pytest benchmarks --benchmark-autosave)"


@cache
def validator(name: str) -> jsonschema.protocols.Validator:
    """The Draft 2020-12 validator of the packaged schema `name` (read once per process)."""
    schema = json.loads(files(__package__).joinpath(name).read_text("utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _where(path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".") or "(top level)"


def check(doc: Any, name: str, where: str, fix: str) -> None:
    """Refuse `doc` unless it is valid against the schema `name`: one line naming the field, what it must be and
    the fix (the first error jsonschema ranks most relevant)."""
    err = jsonschema.exceptions.best_match(validator(name).iter_errors(doc))
    if err is None:
        return
    what = err.message if len(err.message) <= 160 else err.message[:150] + "..."
    raise ReportInputError(f"{where}: {_where(err.absolute_path)}: {what} (schema {name}, rule {err.validator}): "
                           f"{fix}")


def check_benchmark(doc: Any, where: str) -> None:
    """A canonical benchmark.json, against benchmark.schema.json."""
    check(doc, "benchmark.schema.json", where, REBUILD)


def check_saved(doc: Any, where: str) -> None:
    """The fields of a saved run the report reads beyond its cases' figures (machine_info, commit_info, the `dflash`
    section, the loop timings), against saved.schema.json."""
    check(doc, "saved.schema.json", where, RERUN)
