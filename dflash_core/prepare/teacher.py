"""Teacher data: the target's greedy continuations of the train seeds, with what drafter training reads of the
target (hidden-state taps of every fed row, the target's top-k logits at every generated position) captured in
the same forwards, so no second pass over the data recomputes them.

Generation is batched by prompt length (no padding) or, for a target that pads exactly, in left-padded batches of
mixed lengths (`padded_batches`, PrepareConfig.teacher_batching), and can be sharded over the ranks of a `torchrun`
group: the batches are the same as unsharded and each rank runs every `world`-th of them, so each batch computes
exactly what it computes in one process and the merged result equals the unsharded one. Each rank
writes its shard to the run's work directory; every rank then reads all shards, and the merged data is kept
there (`teacher.safetensors`) so a killed `prepare` resumes without generating again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ArtifactError
from ..progress import logged
from ..runtime.target import batch_teacher
from . import distributed as dist

log = logging.getLogger(__name__)

TEACHER_BATCH = 128  # prompts per batched teacher forward: fills 2 cores on the mini target, small in memory
PADDED_BATCH = 256  # prompts per padded batch (`padded_batches`): on a 2-core AVX2 EPYC SmolLM2's teacher made
# 104 tokens/s at 32 rows, 183 at 128, 180-238 at 256 (runs of one batch), 227 at 512: past 128 rows little changes
# (studies/2026-12-07-padded-teacher/)
PAD_WASTE = 0.1  # a padded batch's pad rows stay under this share of the rows it feeds (prompt + new tokens)
TEACHER_FILE = "teacher.safetensors"
ROW_TENSORS = ("taps", "top_logits", "top_ids", "prompt_preds")  # a row's tensors after its sequence, in order


@dataclass
class TeacherData:
    """Trajectories (prompt + continuation) and, per trajectory, the taps of its first L-1 rows and the target's
    top-k (logits, ids) at rows prompt_len-1 .. L-2 (the rows whose argmax is a generated token)."""

    sequences: list[list[int]]
    prompt_lens: list[int]
    taps: list[torch.Tensor] | None = None  # [L-1, n_taps * hidden] each
    top_logits: list[torch.Tensor] | None = None  # [L - prompt_len, k] float32 each
    top_ids: list[torch.Tensor] | None = None  # [L - prompt_len, k] long each
    tap_layers: tuple[int, ...] = ()
    # teacher-forced text (`forced_data`): per sequence the target's argmax prediction of each token [L] (row 0:
    # the first token itself), None for a generated trajectory (its tokens are the target's own)
    preds: list[torch.Tensor | None] | None = None
    # per generated trajectory the target's argmax at its prompt rows but the last [prompt_len - 1] (its own
    # prediction of seed tokens 1..; `batch_teacher(prompt_preds=True)`), None where not recorded: what anchors
    # inside the seed are labelled with under TrainConfig.seed_labels = 'target'
    prompt_preds: list[torch.Tensor | None] | None = None

    def __len__(self) -> int:
        return len(self.sequences)

    def select(self, keep: Sequence[int]) -> "TeacherData":
        """The trajectories with the given indexes (held-out drops, length filters), in that order."""
        pick = lambda xs: None if xs is None else [xs[i] for i in keep]  # noqa: E731
        return TeacherData([self.sequences[i] for i in keep], [self.prompt_lens[i] for i in keep], pick(self.taps),
                           pick(self.top_logits), pick(self.top_ids), self.tap_layers, pick(self.preds),
                           pick(self.prompt_preds))

    def forced(self, i: int) -> bool:
        return self.preds is not None and self.preds[i] is not None

    def own_tokens(self, i: int) -> torch.Tensor:
        """The target's own tokens of sequence i: its generated continuation, or its predictions of forced text."""
        if self.forced(i):
            return self.preds[i][1:]
        return torch.tensor(self.sequences[i][self.prompt_lens[i]:], dtype=torch.long)

    def extend(self, other: "TeacherData") -> "TeacherData":
        """These sequences followed by `other`'s (same taps). Top-k logits: where only one side has them (generated
        trajectories beside teacher-forced text, which records none), the other side's sequences get empty [0, k]
        rows, so distillation still covers the trajectories that have them and the rest train on their labels."""
        if self.taps is not None and other.taps is not None and self.tap_layers != other.tap_layers:
            # rows of different layers side by side would train the fusion on features it never sees at decode
            raise ValueError(f"teacher data tapped at layers {list(self.tap_layers)} cannot be extended with data "
                             f"tapped at {list(other.tap_layers)}")
        n, m = len(self), len(other)
        both = lambda a, b: None if a is None or b is None else a + b  # noqa: E731
        top = lambda a, b, d: None if a is None and b is None else \
            (a or _empty_top(b, n, d)) + (b or _empty_top(a, m, d))  # noqa: E731
        either = lambda a, b: None if a is None and b is None else (a or [None] * n) + (b or [None] * m)  # noqa: E731
        return TeacherData(self.sequences + other.sequences, self.prompt_lens + other.prompt_lens,
                           both(self.taps, other.taps), top(self.top_logits, other.top_logits, torch.float32),
                           top(self.top_ids, other.top_ids, torch.long), self.tap_layers or other.tap_layers,
                           either(self.preds, other.preds), either(self.prompt_preds, other.prompt_preds))


def _empty_top(like: list[torch.Tensor] | None, count: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """`count` empty [0, k] top-k rows, k as in `like` (the side that has them)."""
    k = like[0].shape[-1] if like else 0
    return [torch.empty(0, k, dtype=dtype) for _ in range(count)]


def length_buckets(seqs: Sequence[Sequence[int]], size: int) -> list[list[int]]:
    """Indices of `seqs` grouped by length (then chunked to `size`): batches that need no padding."""
    by_len: dict[int, list[int]] = {}
    for i, s in enumerate(seqs):
        by_len.setdefault(len(s), []).append(i)
    return [idx[j:j + size] for _, idx in sorted(by_len.items()) for j in range(0, len(idx), size)]


def padded_batches(lengths: Sequence[int], new_tokens: int, size: int = PADDED_BATCH,
                   waste: float = PAD_WASTE) -> list[list[int]]:
    """Indices grouped for left-padded batches: by ascending length, at most `size` a batch, and a new batch
    wherever the pad rows would pass `waste` of the rows the batch feeds (the prompts padded to the longest, then
    `new_tokens` steps), so one long prompt does not make 255 short ones pay its length."""
    out: list[list[int]] = []
    cur: list[int] = []
    fed = 0  # the prompt rows of `cur`
    for i in sorted(range(len(lengths)), key=lambda j: (lengths[j], j)):
        n, top = len(cur) + 1, lengths[i]  # ascending: i is the longest so far
        if cur and (n > size or n * top - (fed + top) > waste * n * (top + new_tokens)):
            out.append(cur)
            cur, fed = [], 0
        cur.append(i)
        fed += top
    return out + [cur] if cur else out


def generate_shard(rt, prompts: Sequence[Sequence[int]], new_tokens: int, taps: Sequence[int], top_k: int,
                   rank: int = 0, world: int = 1, batch: int | None = None, progress: bool = False,
                   padded: bool = False, prompt_preds: bool = False) -> dict:
    """This rank's batches (every `world`-th, from `rank`): {prompt index: (sequence, taps, top values, top ids,
    prompt predictions)}.
    `padded`: left-padded batches of `padded_batches` instead of length buckets; `batch` (prompts a batch)
    defaults to PADDED_BATCH then, else TEACHER_BATCH."""
    prompts = [list(p) for p in prompts]
    batch = batch or (PADDED_BATCH if padded else TEACHER_BATCH)
    groups = padded_batches([len(p) for p in prompts], new_tokens, batch) if padded else length_buckets(prompts, batch)
    mine = groups[rank::world]
    out: dict[int, tuple] = {}
    desc = "teacher batches" if world == 1 else f"teacher batches (rank {rank}/{world})"
    for idx in logged(mine, desc, len(mine), log, show=progress):
        conts, hid, tops, pp = batch_teacher(rt, [prompts[i] for i in idx], new_tokens, taps, top_k, padded=padded,
                                             prompt_preds=prompt_preds)
        for r, i in enumerate(idx):
            top_v, top_i = (None, None) if tops is None else (tops[0][r].contiguous(), tops[1][r].contiguous())
            out[i] = (prompts[i] + conts[r], None if hid is None else hid[r].contiguous(), top_v, top_i,
                      None if pp is None else pp[r].contiguous())
    return out


def merge_shards(shards: Sequence[dict], prompts: Sequence[Sequence[int]], taps: Sequence[int]) -> TeacherData:
    rows: dict[int, tuple] = {}
    for sh in shards:
        rows.update(sh)
    if sorted(rows) != list(range(len(prompts))):
        raise ArtifactError(f"teacher shards cover {len(rows)} of {len(prompts)} prompts: a rank's shard is missing")
    col = lambda j: None if rows[0][j] is None else [rows[i][j] for i in range(len(prompts))]  # noqa: E731
    pp = col(4) if all(len(rows[i]) > 4 for i in rows) else None
    return TeacherData([rows[i][0] for i in range(len(prompts))], [len(p) for p in prompts], col(1), col(2), col(3),
                       tuple(int(t) for t in taps), prompt_preds=pp)


def teacher_data(rt, prompts: Sequence[Sequence[int]], new_tokens: int, taps: Sequence[int] = (), top_k: int = 0,
                 *, work: Path | None = None, batch: int | None = None, progress: bool = False,
                 dtype: str = "float32", padded: bool = False, prompt_preds: bool = False) -> TeacherData:
    """Generate (or, from `work`, reload) the teacher data; sharded over the ranks of a torchrun group.

    Every rank returns the whole merged data. Without a process group this is one shard in this process. With
    `work`, the merged data is saved there by rank 0 and reused by a later call with the same inputs. `dtype`:
    the matmul dtype the caller runs the target's forwards in (its autocast), part of the reuse key, as is
    `padded` (left-padded batches of mixed prompt lengths, `generate_shard`), and `prompt_preds` (the target's
    argmax at the prompt rows, `batch_teacher`).
    """
    rank, world = dist.rank(), dist.world_size()
    key = _key(prompts, new_tokens, taps, top_k, dtype, padded, prompt_preds)
    if work is not None:
        rows = load_rows(work / TEACHER_FILE, key)
        if rows is not None:
            log.info("teacher data reloaded from %s (a resumed prepare)", work / TEACHER_FILE)
            return merge_shards([rows], prompts, taps)
    shard = generate_shard(rt, prompts, new_tokens, taps, top_k, rank, world, batch, progress, padded, prompt_preds)
    if world == 1:
        data = merge_shards([shard], prompts, taps)
    elif work is None:
        data = merge_shards(dist.all_gather_object(shard), prompts, taps)
    else:  # through files: the taps of a real target are gigabytes, too much for one pickled collective
        part = work / f"teacher-shard-{rank}-of-{world}.safetensors"
        save_rows(part, shard, key)
        dist.barrier()
        shards = []
        for r in range(world):
            rows = load_rows(work / f"teacher-shard-{r}-of-{world}.safetensors", key)
            if rows is None:
                raise ArtifactError(f"the teacher shard of rank {r} in {work} is missing or unreadable")
            shards.append(rows)
        data = merge_shards(shards, prompts, taps)
        dist.barrier()
        part.unlink(missing_ok=True)
    if work is not None and rank == 0:
        save_rows(work / TEACHER_FILE, rows_of(data), key)
    dist.barrier()
    return data


def save_teacher(work: Path, data: TeacherData, prompts, new_tokens: int, taps, top_k: int, dtype: str = "float32",
                 padded: bool = False, prompt_preds: bool = False) -> None:
    """Keep `data` in `work` as `teacher_data` would have for these inputs, so a resumed run reloads it there (data
    put together from several calls: the prepare budget's chunks)."""
    save_rows(work / TEACHER_FILE, rows_of(data), _key(prompts, new_tokens, taps, top_k, dtype, padded, prompt_preds))


def rows_of(data: TeacherData) -> dict:
    cols = (data.taps, data.top_logits, data.top_ids, data.prompt_preds)
    return {i: (data.sequences[i], *(None if c is None else c[i] for c in cols)) for i in range(len(data))}


def _key(prompts, new_tokens, taps, top_k, dtype: str = "float32", padded: bool = False,
         prompt_preds: bool = False) -> str:
    doc = {"prompts": [list(map(int, p)) for p in prompts], "new_tokens": int(new_tokens),
           "taps": [int(t) for t in taps], "top_k": int(top_k)}
    if dtype != "float32":  # float32 keys stay what they were before the teacher had a dtype
        doc["dtype"] = dtype
    if padded:  # and length-bucketed keys what they were before padded batches
        doc["padded"] = True
    if prompt_preds:  # and keys without the prompt rows' predictions what they were before them
        doc["prompt_preds"] = True
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()


def save_rows(path: Path, rows: dict, key: str) -> None:
    """Rows {index: (sequence, taps, top values, top ids, prompt predictions)} as one safetensors file: one tensor
    per row and kind (no concatenated copy of gigabytes of taps), sequences in the metadata. Written straight to a
    temporary file and renamed, so a kill mid-write leaves no file under the final name."""
    from safetensors.torch import save_file

    order = sorted(rows)
    meta = {"key": key, "index": order, "sequences": [list(map(int, rows[i][0])) for i in order]}
    tensors = {f"{name}/{r}": rows[i][j] for j, name in enumerate(ROW_TENSORS, start=1)
               for r, i in enumerate(order) if len(rows[i]) > j and rows[i][j] is not None}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
    try:
        save_file(tensors, str(tmp), metadata={"teacher": json.dumps(meta)})
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_rows(path: Path, key: str) -> dict | None:
    """The rows `save_rows` wrote for `key`, else None (absent, unreadable or written for other inputs)."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            meta = json.loads((f.metadata() or {})["teacher"])
            if meta.get("key") != key:
                return None
            names = ROW_TENSORS
            have = set(f.keys())
            return {i: (meta["sequences"][r], *(f.get_tensor(f"{n}/{r}") if f"{n}/{r}" in have else None
                                                for n in names))
                    for r, i in enumerate(meta["index"])}
    except (SafetensorError, OSError, ValueError, KeyError, RuntimeError) as exc:
        log.warning("ignoring unreadable teacher data %s: %s", path, exc)
        return None


FORCED_BATCH = 8  # chunks per teacher-forced forward: its full logits are [8, 128, vocab] (200 MB at 49k)


def forced_data(rt, chunks: Sequence[Sequence[int]], taps: Sequence[int], batch: int = FORCED_BATCH,
                progress: bool = False) -> TeacherData:
    """Teacher-forced passes over training text: one uncached forward per batch of equal-length token chunks
    gives the taps of every row and the target's argmax at every position, far cheaper per labelled token than
    generating (a prefill instead of one forward per token). The labels are the target's own predictions
    (`TeacherData.preds`); training uses label k of an anchor only while the text follows the target's
    predictions, i.e. where it is the greedy continuation."""
    chunks = [list(c) for c in chunks]
    seqs, feats, preds = [None] * len(chunks), [None] * len(chunks), [None] * len(chunks)
    buckets = length_buckets(chunks, batch)
    for idx in logged(buckets, "teacher-forced text", len(buckets), log, show=progress):
        inp = torch.tensor([chunks[i] for i in idx], dtype=torch.long, device=rt.device)
        with torch.inference_mode():
            out = rt.model(input_ids=inp, use_cache=False, output_hidden_states=[int(t) + 1 for t in taps])
            top = out.logits.argmax(-1).cpu()
            hidden = torch.cat([out.hidden_states[int(t) + 1] for t in taps], dim=-1).cpu()
        for r, i in enumerate(idx):
            seqs[i] = chunks[i]
            feats[i] = hidden[r, :-1].clone()
            preds[i] = torch.cat([inp[r, :1].cpu(), top[r, :-1]])
    return TeacherData(seqs, [1] * len(chunks), feats, None, None, tuple(int(t) for t in taps), preds)
