"""A user's own benchmark prompts (`--prompts-file FILE`): read and checked before anything is built.

Two forms, by suffix: `.jsonl`, one JSON object per line, `{"text": "...", "task": "chat"}` (`task` optional,
default `user`; the report breaks tau and speedup down by it), or any other name, plain UTF-8 text with one
prompt per non-empty line (task `user`; a prompt with line breaks needs the JSONL form). The file is hostile
input: a regular file of at most MAX_BYTES, at most MAX_PROMPTS prompts of 1..MAX_CHARS characters each, no
duplicates, task ids as in prompts.json. Whether the prompts are held out from the drafter's training text is
checked once the drafter is known (`bench.userprompts`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInputError
from ..safeio import check_regular_file
from .data import TASK_RE

MAX_BYTES = 1 << 20
MAX_PROMPTS = 256
MAX_CHARS = 8192
DEFAULT_TASK = "user"
FIX = ("give a text file with one prompt per line, or a .jsonl file of {\"text\": ..., \"task\": ...} lines "
       f"(at most {MAX_PROMPTS} prompts of at most {MAX_CHARS} characters)")


@dataclass(frozen=True)
class PromptFile:
    path: str  # absolute
    prompts: tuple[str, ...]
    tasks: tuple[str, ...]


def read_prompt_file(path: str | Path) -> PromptFile:
    """The prompts and task ids of `path`, checked (module docstring); one BadInputError naming the fix."""
    p = Path(path).expanduser()
    what = "--prompts-file"
    check_regular_file(p, what, BadInputError, FIX, MAX_BYTES)
    try:
        raw = p.read_bytes()[:MAX_BYTES + 1]
    except OSError as exc:
        raise BadInputError(f"{what} {p} cannot be read ({exc.strerror or exc}): {FIX}") from exc
    if len(raw) > MAX_BYTES:
        raise BadInputError(f"{what} {p} is larger than {MAX_BYTES} bytes: {FIX}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInputError(f"{what} {p} is not UTF-8 text (byte {exc.start}): {FIX}") from None
    rows = [(i + 1, ln) for i, ln in enumerate(_lines(text)) if ln.strip()]
    prompts, tasks = [], []
    for n, line in rows:
        if len(prompts) >= MAX_PROMPTS:
            raise BadInputError(f"{what} {p} holds more than {MAX_PROMPTS} prompts: {FIX}")
        prompt, task = _jsonl_row(line, f"{what} {p} line {n}") if p.suffix == ".jsonl" else (line, DEFAULT_TASK)
        if not _encodable(prompt):  # a JSON escape "\ud800": the tokenizer raised on it minutes later
            raise BadInputError(f"{what} {p} line {n} holds a lone surrogate (an unpaired \\ud800-\\udfff escape), "
                                f"not text: {FIX}")
        if len(prompt) > MAX_CHARS or not prompt.strip():
            raise BadInputError(f"{what} {p} line {n}: a prompt must have 1..{MAX_CHARS} characters: {FIX}")
        if prompt in prompts:
            raise BadInputError(f"{what} {p} line {n} repeats the prompt of line {rows[prompts.index(prompt)][0]}: "
                                "give each prompt once")
        prompts.append(prompt)
        tasks.append(task)
    if not prompts:
        raise BadInputError(f"{what} {p} holds no prompt: {FIX}")
    return PromptFile(str(p.resolve()), tuple(prompts), tuple(tasks))


def _lines(text: str) -> list[str]:
    """Lines split only at \\n and \\r\\n, as JSONL and a text file of prompts mean them. Why not `str.splitlines`:
    it also splits at U+2028, U+2029, form feeds and other controls, which JSON strings may hold raw (valid JSONL
    was refused) and which sit inside one line of text (one prompt was read as two)."""
    lines = text.split("\n")
    return [ln[:-1] if ln.endswith("\r") else ln for ln in lines]


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _jsonl_row(line: str, where: str) -> tuple[str, str]:
    try:
        row = json.loads(line)
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, and int() of a 5,000-digit number
        raise BadInputError(f"{where} is not one JSON object ({str(exc)[:80]}): {FIX}") from None
    if not isinstance(row, dict) or set(row) - {"text", "task"} or not isinstance(row.get("text"), str):
        raise BadInputError(f"{where} must be an object with a string \"text\" and an optional \"task\" (and no other "
                            f"field): {FIX}")
    task = row.get("task", DEFAULT_TASK)
    if not isinstance(task, str) or not TASK_RE.fullmatch(task):
        raise BadInputError(f"{where}: task {str(task)[:40]!r} must match {TASK_RE.pattern} (a report key): "
                            "name the task with lowercase letters, digits and _")
    return row["text"], task
