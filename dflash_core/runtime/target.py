"""The target (verifier) runtime: an LFM2 (or any croppable-cache causal LM) loaded through transformers.

A `TargetSession` owns one decode's cache. It offers the three operations speculative decoding needs:
prefill the prompt, verify a block `[last committed, d1..dw]` in one forward (greedy ids of the w+1 rows,
argmax on the device, optional hidden-state taps for the drafter), and roll back the rejected suffix.

Rollback of LFM2's hybrid cache uses transformers' own mechanism (>= 5.14): with
`cache.activate_past_recording()` the conv layers keep the whole `[old window | block conv inputs]`, and
`cache.crop(-r)` re-slices the 3-column window ending at the last kept token while attention layers drop
their last r K/V rows. No extra forward. `rollback="kv_only"` crops attention K/V only and leaves the conv
window advanced; it is wrong on purpose and exists as the tests' negative control.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ArtifactError, BadInputError, TargetNotFoundError
from ..store.artifacts import TARGET_MANIFEST, compute_identity, reading_lock, verify_target_files
from . import transfer
from .checkpoint import _checkpoint_meta, _hub_snapshot, _load_model, _load_tokenizer, resolve_target_source
from .device import resolve_device, resolve_dtype
from .kernels import apply_kernels, resolve_kernels, tune
from .numerics import NonFiniteLogits
from .transfer import mark, seconds_between

ROLLBACKS = ("exact", "kv_only")


@dataclass
class StepOutput:
    """What one target forward returns: greedy ids of the kept rows and, when asked, taps and margins."""

    ids: list[int]
    hidden: Any = None  # tensor [rows, n_taps * hidden] on the target device, or None
    margins: list[float] | None = None  # top1 - top2 logit per kept row (float), or None
    seconds: float = 0.0
    block: list[int] | None = None  # the ids fed (host copy; drafts handed over on the device come back here)


@dataclass(eq=False)  # identity semantics: hashable, usable as a cache key
class TargetRuntime:
    """A loaded target model plus how to run it. Build with `load_target` or `TargetRuntime.from_model`."""

    model: Any
    device: Any
    dtype: Any
    name: str
    tokenizer: Any = None
    cached: bool = True
    rollback: str = "exact"
    source: str = ""
    info: dict = field(default_factory=dict)
    kernels: str = "eager"  # execution path of the linear layers (dflash_core.runtime.kernels)

    @classmethod
    def from_model(cls, model, *, name: str = "in-memory", tokenizer=None, cached: bool = True,
                   rollback: str = "exact") -> "TargetRuntime":
        """Wrap an already built model (tests build tiny ones in memory)."""
        p = next(model.parameters())
        if rollback not in ROLLBACKS:
            raise BadInputError(f"unknown rollback {rollback!r}: use one of {ROLLBACKS}")
        model.eval()
        return cls(model=model, device=p.device, dtype=p.dtype, name=name, tokenizer=tokenizer,
                   cached=cached, rollback=rollback)

    # --- facts about the model -------------------------------------------------------------
    @property
    def config(self):
        return self.model.config

    @property
    def max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 1 << 30))

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self.config, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        return eos

    def with_options(self, *, cached: bool | None = None, rollback: str | None = None) -> "TargetRuntime":
        """Same weights, other run options (e.g. the uncached seed protocol or the negative control)."""
        rb = self.rollback if rollback is None else rollback
        if rb not in ROLLBACKS:
            raise BadInputError(f"unknown rollback {rb!r}: use one of {ROLLBACKS}")
        return TargetRuntime(model=self.model, device=self.device, dtype=self.dtype, name=self.name,
                             tokenizer=self.tokenizer, cached=self.cached if cached is None else cached,
                             rollback=rb, source=self.source, info=self.info, kernels=self.kernels)

    # --- text -------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Tokenize a prompt the way the target was trained (BOS first when the tokenizer adds it)."""
        if not isinstance(text, str) or not text.strip():
            raise BadInputError("empty prompt: give at least one non-blank character of text")
        if self.tokenizer is None:
            raise BadInputError(f"target {self.name!r} has no tokenizer: pass token ids instead of text")
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return " ".join(str(i) for i in ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def session(self, *, recording: bool = True) -> "TargetSession":
        """A fresh decode session. `recording=False` is for plain greedy (no rollback needed)."""
        return TargetSession(self, recording=recording)

    def check_prompt(self, prompt_ids: Sequence[int], max_new_tokens: int) -> list[int]:
        """Validate ids and lengths before any forward, with messages that name the fix."""
        if max_new_tokens is None or int(max_new_tokens) != max_new_tokens or max_new_tokens < 0:
            raise BadInputError(f"token budget must be an integer >= 0, got {max_new_tokens!r}")
        ids = [int(t) for t in prompt_ids]
        if not ids:
            raise BadInputError("empty prompt: give at least one token (text prompts get BOS from the tokenizer)")
        bad = [t for t in ids if t < 0 or t >= self.vocab_size]
        if bad:
            raise BadInputError(f"prompt has token ids outside 0..{self.vocab_size - 1}: {bad[:5]}")
        if len(ids) >= self.max_positions:
            raise BadInputError(
                f"prompt of {len(ids)} tokens is longer than the target's context of {self.max_positions} "
                "positions: shorten the prompt")
        if len(ids) + max_new_tokens > self.max_positions:
            raise BadInputError(
                f"prompt ({len(ids)}) + token budget ({max_new_tokens}) exceeds the target's context of "
                f"{self.max_positions} positions: lower --tokens or shorten the prompt")
        return ids


class TargetSession:
    """One decode's target state: the cache (or, uncached, the committed prefix) and its rollback."""

    def __init__(self, runtime: TargetRuntime, *, recording: bool):
        self.rt = runtime
        self.recording = recording and runtime.cached
        self.cache = None
        self.prefix: list[int] = []  # tokens whose K/V (or conv inputs) the target has absorbed
        self.forwards = 0

    def _new_cache(self):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.rt.model.config)
        if self.recording:
            cache.activate_past_recording()
        return cache

    def _forward(self, tokens, keep: int, taps: Sequence[int], margins: bool) -> StepOutput:
        """One forward over `tokens` (host ids, or a 1-D long tensor on the device: drafts that never left it).
        Exactly one device-to-host transfer (`transfer.to_host`): the kept rows' greedy ids, the finite-logit flag,
        the fed ids when they came as a tensor, and the margins when asked."""
        import torch

        rt = self.rt
        t0 = time.perf_counter()
        start = mark(rt.device)
        kwargs: dict[str, Any] = {"logits_to_keep": keep}
        if taps:
            # Index 0 of hidden_states is the embedding output, so layer l's output is at l + 1.
            kwargs["output_hidden_states"] = [int(t) + 1 for t in taps]
        with torch.inference_mode():
            on_device = isinstance(tokens, torch.Tensor)
            block = tokens.to(dtype=torch.long) if on_device else torch.tensor(tokens, dtype=torch.long,
                                                                                device=rt.device)
            rows = int(block.shape[0])
            if rt.cached:
                if self.cache is None:
                    self.cache = self._new_cache()
                out = rt.model(input_ids=block.view(1, -1), **cache_kwargs(rt.model, self.cache), use_cache=True,
                               **kwargs)
            else:
                prefix = torch.tensor(self.prefix, dtype=torch.long, device=rt.device)
                out = rt.model(input_ids=torch.cat([prefix, block]).view(1, -1), use_cache=False, **kwargs)
            logits = out.logits[0, -keep:]
            hidden = None
            if taps:
                hs = out.hidden_states
                hidden = torch.cat([hs[int(t) + 1][0, -rows:] for t in taps], dim=-1)
            packed = [logits.argmax(dim=-1), torch.isfinite(logits).all().view(1).long()]
            if on_device:
                packed.append(block)
            parts = [torch.cat(packed)]
            if margins:
                top2 = logits.float().topk(2, dim=-1).values
                parts.append(top2[:, 0] - top2[:, 1])
            host = transfer.to_host(*parts)  # the forward's one transfer (it synchronises the device)
        ids, finite = host[0][:keep], host[0][keep]
        if not finite:
            raise NonFiniteLogits(f"target {rt.name!r} produced non-finite logits (inf/NaN) in {rt.dtype}: the dtype "
                                  "overflowed or the device is faulty; use float32 or bfloat16, or check the device")
        self.forwards += 1
        seconds = time.perf_counter() - t0 if isinstance(start, float) else seconds_between(start, mark(rt.device))
        return StepOutput(ids=ids, hidden=hidden, margins=host[1] if margins else None, seconds=seconds,
                          block=host[0][keep + 1:] if on_device else list(tokens))

    def prefill(self, prompt: list[int], *, taps: Sequence[int] = (), margins: bool = False) -> StepOutput:
        """Absorb the prompt; return the greedy next token (1 kept row) and taps for every prompt row."""
        out = self._forward(list(prompt), 1, taps, margins)
        self.prefix.extend(prompt)
        self._settle(0)
        return out

    def verify(self, block, *, taps: Sequence[int] = (), margins: bool = False) -> StepOutput:
        """One forward over `[last committed, d1..dw]`: the target's greedy id after each of the w+1 prefixes.
        `block`: host ids, or a long tensor on the device (its host copy comes back as `StepOutput.block`)."""
        import torch

        n = int(block.shape[0]) if isinstance(block, torch.Tensor) else len(block)
        out = self._forward(block if isinstance(block, torch.Tensor) else list(block), n, taps, margins)
        self.prefix.extend(out.block)
        return out

    def rollback(self, n_rejected: int) -> None:
        """Forget the last `n_rejected` tokens of the latest block (0 when all were accepted)."""
        if n_rejected < 0:
            raise BadInputError(f"cannot roll back a negative number of tokens ({n_rejected})")
        if n_rejected:
            del self.prefix[-n_rejected:]
        self._settle(n_rejected)

    def _settle(self, n_rejected: int) -> None:
        """Apply the rollback to the cache. Called after every forward so recorded conv windows shrink back."""
        if not self.rt.cached or self.cache is None or not self.recording:
            if n_rejected and self.rt.cached:
                raise RuntimeError("rollback needs a recording session: use runtime.session(recording=True)")
            return
        if self.rt.rollback == "exact":
            self.cache.crop(-n_rejected)
            return
        # kv_only: the negative control. Attention K/V are cropped; conv windows stay advanced.
        for layer in self.cache.layers:
            if hasattr(layer, "conv_states"):
                _shrink_conv_only(layer)
            elif n_rejected:
                layer.crop(-n_rejected)


@functools.cache
def _cache_arg(cls) -> str:
    """The name `cls.forward` takes the cache under: `cache` (transformers >= 5.18; `past_key_values` is its
    deprecated alias) or `past_key_values` (5.17 and before, e.g. the lent GPU machine's image, which would pass an
    unknown `cache=` to **kwargs and decode without a cache, silently)."""
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"


def cache_kwargs(model, cache) -> dict:
    """`{name: cache}` under the name this model's forward takes its cache by (`_cache_arg`)."""
    return {_cache_arg(type(model)): cache}


def _shrink_conv_only(layer) -> None:
    """Keep the newest conv window (as if every verified token had been accepted)."""
    from transformers.cache_utils import LinearAttentionLayer

    LinearAttentionLayer.crop(layer, 0)


# --- loading ------------------------------------------------------------------------------------

# Files a hub snapshot needs: config, safetensors weights, tokenizer. No *.py (the lab never runs a
# checkpoint's code) and no pickled *.bin weights.
def load_target(target: str = "mini", device: str = "cpu", dtype: str | None = None, *, cached: bool = True,
                home: str | Path | None = None, kernels: str = "eager", revision: str | None = None
                ) -> TargetRuntime:
    """Load a target by alias, local directory or hub id through `from_pretrained`, on a device and dtype.

    `revision` (hub ids only) is a branch, tag or commit; the resolved commit is recorded in `rt.info` and in
    the target identity, so reports name the exact weights. A directory with a `target_manifest.json` (the
    mini target and copies of it) is verified file by file before anything is loaded.
    """
    import torch

    dev = resolve_device(device)
    tdtype = resolve_dtype(dtype, dev)
    kind, where = resolve_target_source(target, home)
    if revision is not None and kind != "hub":
        raise BadInputError(f"--revision {revision!r} applies to hub ids only; {target!r} is a {kind} target")
    error = ArtifactError if kind == "mini" else TargetNotFoundError
    commit = None
    if kind == "hub":
        snap = _hub_snapshot(where, revision)
        commit, where = snap.name, str(snap)
    path = Path(where)
    with reading_lock(path):  # the mini target: wait for a prepare that is rebuilding it
        if kind == "mini" and not (path / "config.json").is_file():
            raise ArtifactError(f"the mini target is not built yet ({where} is missing): run "
                                "`python -m dflash_core prepare --target mini`")
        if kind == "mini" or (path / TARGET_MANIFEST).is_file():
            fix = ("run `python -m dflash_core prepare --target mini --refresh`" if kind == "mini"
                   else f"restore the checkpoint in {where} from its source")
            if kind == "mini" and not (path / TARGET_MANIFEST).is_file():
                fix = ("run `python -m dflash_core prepare --target mini` (it records the manifest of a mini "
                       "target built before target manifests existed)")
            verify_target_files(path, fix)
        meta = _checkpoint_meta(path, error)
        model = _load_model(path, error)
        model.eval()
        tok = _load_tokenizer(path, error)
    rt = TargetRuntime(model=model, device=torch.device("cpu"), dtype=torch.float32, name=target, tokenizer=tok,
                       cached=cached, source=where)
    ident = compute_identity(model, tok, target)  # at float32, before any cast or kernel repacking
    ident.update({"revision": revision if kind == "hub" else None, "hub_commit": commit})
    rt.info = {"kind": kind, "location": where, "parameters": ident["parameters"], "revision": revision,
               "commit": commit, "family": meta["family"], "mini_corpus_files": meta["mini_corpus_files"],
               "mini_seed": meta["mini_seed"],
               "identity": ident}
    model.to(device=dev, dtype=tdtype)
    rt.device, rt.dtype = dev, tdtype
    kpath = resolve_kernels(kernels, dev, tdtype, rt.hidden_size)
    if kpath == "tuned":  # the layouts measured on this machine go into the target's info, so every report has them
        rt.info["kernel_layouts"] = tune(model)
    elif kpath != "eager":
        apply_kernels(model, kpath)
    rt.kernels = kpath
    return rt


# --- batched teacher work (prepare) -------------------------------------------------------------

def batch_greedy(rt: TargetRuntime, prompts: Sequence[Sequence[int]], new_tokens: int) -> list[list[int]]:
    """Greedy continuations (exactly `new_tokens`, no EOS stop) of equal-length prompts in one cached batch.

    No padding, so every row computes what a one-prompt decode computes; only the batched matmuls' summation
    order can differ (float64: identical ids; float32: near-ties may flip). For teacher data, not decoding.
    """
    return batch_teacher(rt, prompts, new_tokens)[0]


# Model types whose forward takes a left-padded batch (attention mask + position ids) and computes for each row
# what the unpadded row computes: attention masks the pad keys, RoPE reads the given positions, and LFM2 zeroes
# pad rows before its short convolutions (a causal conv's own left padding is zeros too). Checked by
# tests/prepare/test_teacher.py on tiny float64 models of both; any other type keeps the length buckets, since a layer
# that does not mask (a recurrent state, a learned absolute position) would carry the padding into real rows.
PADDED_MODEL_TYPES = ("lfm2", "llama")


def pads_exactly(rt: TargetRuntime) -> bool:
    """Whether this target's batches may mix prompt lengths by left padding (PADDED_MODEL_TYPES)."""
    return getattr(getattr(rt.model, "config", None), "model_type", None) in PADDED_MODEL_TYPES


def teacher_cache(rt: TargetRuntime, rows: int) -> Any:
    """A cache of `rows` positions allocated once (transformers' StaticCache), for the padded teacher batches.

    A growing cache concatenates every layer's keys and values at each step: at SmolLM2's 256-row padded steps
    that copy was a quarter of a step in a profile and the static cache saved 6-12 % of a step
    (docs/real-targets.md, "A static teacher cache and batched fit examples"). With the padding mask both compute
    the same bits (tests/prepare/test_teacher.py); the length buckets (no mask: causal attention over a growing cache)
    keep the growing cache, whose kernels the static cache's explicit mask would change at float rounding, and
    with them the mini target's teacher data.
    """
    from transformers import StaticCache

    return StaticCache(config=rt.model.config, max_cache_len=rows)


def batch_teacher(rt: TargetRuntime, prompts: Sequence[Sequence[int]], new_tokens: int, taps: Sequence[int] = (),
                  top_k: int = 0, padded: bool = False,
                  prompt_preds: bool = False) -> tuple[list[list[int]], Any, Any, Any]:
    """`batch_greedy`, plus what drafter training needs from the same forwards (no second pass over the data):

    * taps [n, plen + new_tokens - 1, n_taps * hidden]: the hidden-state taps of every row the target was fed
      (the prompt, then each generated token but the last, which no forward reads), as `batch_taps` gives them
      up to the cached forwards' summation order;
    * top-k (values, ids) [n, new_tokens, k] of the target's logits at rows plen-1 .. plen+new_tokens-2, i.e.
      the distribution each generated token was the argmax of (float32 values);
    * with `prompt_preds`: the target's argmax at every prompt row but the last, [len(prompt i) - 1] per prompt
      (its own prediction of prompt tokens 1..; the last row's argmax is the first generated token), from the
      first forward, which computes those rows anyway (it keeps their logits instead of only the last row's).
    Each is None when not asked for (`taps=()`, `top_k=0`, `prompt_preds=False`).

    `padded`: prompts of several lengths in one batch, left-padded with an attention mask and their own position
    ids (only for `pads_exactly` targets); the taps are then a list, row i [len(prompt i) + new_tokens - 1, ...].
    A bucket of one length makes a small batch, and the 2 cores run a 32-row step at under half the tokens per
    second of a 256-row one (studies/2026-12-07-padded-teacher/).
    """
    import torch

    lens = [len(p) for p in prompts]
    if not lens or 0 in lens:
        raise BadInputError("batch_greedy needs non-empty prompts")
    if padded and not pads_exactly(rt):
        raise BadInputError(f"a padded teacher batch needs a model type of {', '.join(PADDED_MODEL_TYPES)} (got "
                            f"{getattr(rt.model.config, 'model_type', None)!r}): bucket the prompts by length")
    if not padded and len(set(lens)) != 1:
        raise BadInputError(f"batch_greedy needs non-empty prompts of one length, got lengths {sorted(set(lens))}: "
                            "bucket the prompts by length first (train.trajectories does)")
    if new_tokens <= 0:
        return [[] for _ in prompts], None, None, None
    width = max(lens)
    pad = [width - n for n in lens]
    if padded:  # exactly the rows the loop feeds: the prompts, then new_tokens - 1 more
        cache = teacher_cache(rt, width + new_tokens - 1)
    else:
        from transformers import DynamicCache

        cache = DynamicCache(config=rt.model.config)
    inp = torch.tensor([[0] * k + list(p) for k, p in zip(pad, prompts)], dtype=torch.long, device=rt.device)
    kwargs: dict[str, Any] = {"output_hidden_states": [int(t) + 1 for t in taps]} if taps else {}
    mask = pos = None
    if padded:  # pad rows: id 0, masked out, position 0; real rows count their positions from 0
        mask = torch.tensor([[0] * k + [1] * n for k, n in zip(pad, lens)], dtype=torch.long, device=rt.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cols, hid, top_v, top_i = [], [], [], []
    preds = None
    with torch.inference_mode():
        for step in range(new_tokens):
            if padded:
                kwargs.update(attention_mask=mask, position_ids=pos)
            rows_too = prompt_preds and step == 0
            out = rt.model(input_ids=inp, **cache_kwargs(rt.model, cache), use_cache=True,
                           logits_to_keep=width if rows_too else 1, **kwargs)
            if rows_too:  # the prompt rows' argmax (pad rows dropped; none for a 1-token prompt), then the last row
                rows = out.logits[:, :-1].argmax(dim=-1).cpu()
                preds = [rows[r, k:] for r, k in enumerate(pad)]
            last = out.logits[:, -1]
            if top_k:
                v, i = torch.topk(last.float(), min(int(top_k), last.shape[-1]), dim=-1)
                top_v.append(v.cpu())
                top_i.append(i.cpu())
            if taps:  # every forward feeds rows whose taps are needed (the last generated token is never fed)
                hid.append(torch.cat([out.hidden_states[int(t) + 1] for t in taps], dim=-1).cpu())
            inp = last.argmax(dim=-1, keepdim=True)
            cols.append(inp)
            if padded:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                pos = pos[:, -1:] + 1
    hidden = torch.cat(hid, dim=1) if taps else None
    if padded and hidden is not None:
        hidden = [hidden[r, k:] for r, k in enumerate(pad)]
    tops = (torch.stack(top_v, 1), torch.stack(top_i, 1)) if top_k else None
    return torch.cat(cols, dim=1).tolist(), hidden, tops, preds


def trajectory_taps(rt: TargetRuntime, seq: Sequence[int], taps: Sequence[int]) -> Any:
    """Hidden-state taps of every row of `seq` from one forward (the rows training and the fits feed the drafter)."""
    sess = rt.session(recording=False)
    out = sess.prefill(list(seq), taps=taps)
    return out.hidden.detach().cpu()


def uncached_rows(rt: TargetRuntime, seqs: Sequence[Sequence[int]], taps: Sequence[int],
                  with_logits: bool) -> list[tuple[Any, Any]]:
    """(taps [len, n_taps * hidden], float32 logits [len, V] or None) of every row of each non-empty sequence,
    from ONE uncached forward with the sequences right-padded to the longest.

    No mask is needed: a causal model's row reads no later row (attention and LFM2's short convolutions alike), so
    the pad after a sequence's end changes none of its rows, only the matmuls' row count (float rounding).
    """
    import torch

    width = max(len(s) for s in seqs)
    inp = torch.tensor([list(s) + [0] * (width - len(s)) for s in seqs], dtype=torch.long, device=rt.device)
    with torch.inference_mode():
        out = rt.model(input_ids=inp, use_cache=False, output_hidden_states=[int(t) + 1 for t in taps],
                       **({} if with_logits else {"logits_to_keep": 1}))
        hidden = torch.cat([out.hidden_states[int(t) + 1] for t in taps], dim=-1).detach().cpu()
        logits = out.logits.float().cpu() if with_logits else None
    return [(hidden[i, :len(s)], None if logits is None else logits[i, :len(s)]) for i, s in enumerate(seqs)]


def batch_taps(rt: TargetRuntime, seqs: Sequence[Sequence[int]], taps: Sequence[int]) -> list[Any]:
    """Hidden-state taps of every row of equal-length sequences, one uncached forward for the batch
    (the same rows `TargetSession.prefill(..., taps=...)` returns for each sequence alone)."""
    lens = {len(s) for s in seqs}
    if len(lens) != 1 or 0 in lens:
        raise BadInputError(f"batch_taps needs non-empty sequences of one length, got lengths {sorted(lens)}")
    return [h for h, _ in uncached_rows(rt, seqs, taps, with_logits=False)]
