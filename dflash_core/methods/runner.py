"""Run a registered method by id: the one entry point the CLI, tests and benchmarks share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..runtime.decode import DecodeStats, greedy, speculative
from . import get_method


def run_method(method_id: str, rt, prepared, prompt_ids: Sequence[int], max_new_tokens: int, width: int | None = None,
               *, stop_at_eos: bool = False, trace: list | None = None, **options: Any
               ) -> tuple[list[int], DecodeStats]:
    """Decode with a method; `width` defaults to the drafter's block size. normal ignores width."""
    info = get_method(method_id)
    if info.build is None:
        info.parse_options(options)  # normal takes none: an option given to it is refused, not ignored
        return greedy(rt, prompt_ids, max_new_tokens, stop_at_eos=stop_at_eos)
    prop = info.build(rt, prepared, **options)
    w = prop.max_width if width is None else width
    return speculative(rt, prop, prompt_ids, max_new_tokens, w, method=method_id, stop_at_eos=stop_at_eos,
                       trace=trace)
