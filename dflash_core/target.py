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

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .device import resolve_device, resolve_dtype
from .errors import BadInputError, TargetNotFoundError

ROLLBACKS = ("exact", "kv_only")


@dataclass
class StepOutput:
    """What one target forward returns: greedy ids of the kept rows and, when asked, taps and margins."""

    ids: list[int]
    hidden: Any = None  # tensor [rows, n_taps * hidden] on the target device, or None
    margins: list[float] | None = None  # top1 - top2 logit per kept row (float), or None
    seconds: float = 0.0


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
    kernels: str = "eager"  # execution path of the linear layers (dflash_core.kernels)

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

    def _forward(self, tokens: list[int], keep: int, taps: Sequence[int], margins: bool) -> StepOutput:
        import torch

        rt = self.rt
        t0 = time.perf_counter()
        kwargs: dict[str, Any] = {"logits_to_keep": keep}
        if taps:
            # Index 0 of hidden_states is the embedding output, so layer l's output is at l + 1.
            kwargs["output_hidden_states"] = [int(t) + 1 for t in taps]
        with torch.inference_mode():
            if rt.cached:
                if self.cache is None:
                    self.cache = self._new_cache()
                inp = torch.tensor([tokens], dtype=torch.long, device=rt.device)
                out = rt.model(input_ids=inp, cache=self.cache, use_cache=True, **kwargs)
                rows = len(tokens)
            else:
                inp = torch.tensor([self.prefix + tokens], dtype=torch.long, device=rt.device)
                out = rt.model(input_ids=inp, use_cache=False, **kwargs)
                rows = len(tokens)
            logits = out.logits[0, -keep:]
            ids_t = logits.argmax(dim=-1)
            hidden = None
            if taps:
                hs = out.hidden_states
                hidden = torch.cat([hs[int(t) + 1][0, -rows:] for t in taps], dim=-1)
            gaps = None
            if margins:
                top2 = logits.float().topk(2, dim=-1).values
                gaps = (top2[:, 0] - top2[:, 1]).tolist()
            ids = ids_t.tolist()  # the only host copy: the accepted ids (syncs the device)
        self.forwards += 1
        return StepOutput(ids=ids, hidden=hidden, margins=gaps, seconds=time.perf_counter() - t0)

    def prefill(self, prompt: list[int], *, taps: Sequence[int] = (), margins: bool = False) -> StepOutput:
        """Absorb the prompt; return the greedy next token (1 kept row) and taps for every prompt row."""
        out = self._forward(list(prompt), 1, taps, margins)
        self.prefix.extend(prompt)
        self._settle(0)
        return out

    def verify(self, block: list[int], *, taps: Sequence[int] = (), margins: bool = False) -> StepOutput:
        """One forward over `[last committed, d1..dw]`: the target's greedy id after each of the w+1 prefixes."""
        out = self._forward(list(block), len(block), taps, margins)
        self.prefix.extend(block)
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


def _shrink_conv_only(layer) -> None:
    """Keep the newest conv window (as if every verified token had been accepted)."""
    from transformers.cache_utils import LinearAttentionLayer

    LinearAttentionLayer.crop(layer, 0)


# --- loading ------------------------------------------------------------------------------------

def resolve_target_source(target: str, home: str | Path | None = None) -> tuple[str, str]:
    """Return (kind, location): kind is 'mini', 'local' or 'hub'. Unknown names raise with the options."""
    from . import DEFAULT_HUB_TARGET

    if not isinstance(target, str) or not target.strip():
        raise TargetNotFoundError("empty target name: use 'mini', a local checkpoint directory, or a hub id "
                                  f"such as {DEFAULT_HUB_TARGET}")
    if target == "mini":
        from .artifacts import mini_target_dir

        return "mini", str(mini_target_dir(home))
    p = Path(target).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise TargetNotFoundError(f"target directory {p} has no config.json: point --target at a directory "
                                      "written by save_pretrained()")
        return "local", str(p)
    if p.suffix or target.startswith((".", "/", "~")) or target.count("/") != 1:
        raise TargetNotFoundError(
            f"unknown target {target!r}: not 'mini', not an existing directory, and not a hub id of the form "
            f"owner/name (e.g. {DEFAULT_HUB_TARGET})")
    return "hub", target


def load_target(target: str = "mini", device: str = "cpu", dtype: str | None = None, *, cached: bool = True,
                home: str | Path | None = None, kernels: str = "eager") -> TargetRuntime:
    """Load a target by alias, local directory or hub id through `from_pretrained`, on a device and dtype."""
    dev = resolve_device(device)
    tdtype = resolve_dtype(dtype, dev)
    kind, where = resolve_target_source(target, home)
    if kind == "mini" and not (Path(where) / "config.json").is_file():
        from .errors import ArtifactError

        raise ArtifactError(f"the mini target is not built yet ({where} is missing): run "
                            "`python -m dflash_core prepare --target mini`")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        # Loaded in float32 first: the artifact identity is a property of the checkpoint, so it is hashed at
        # one precision whatever dtype the run uses (prepare works in float32; a float16/bfloat16 run must
        # find the same artifacts). Then cast and moved.
        import torch

        model = AutoModelForCausalLM.from_pretrained(where, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        if kind == "hub":
            raise TargetNotFoundError(
                f"could not load {where!r} from the Hugging Face hub or its local cache ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:200]}). Without hub access, download the checkpoint elsewhere, copy "
                "the directory here and pass --target /path/to/checkpoint (any directory written by "
                "save_pretrained with config.json and weights).") from exc
        raise TargetNotFoundError(f"could not load the checkpoint in {where}: {exc}") from exc
    model.eval()
    tok = None
    try:
        tok = AutoTokenizer.from_pretrained(where)
    except Exception:  # a weights-only checkpoint (e.g. the random 350M test config) has no tokenizer
        tok = None
    from .artifacts import target_identity
    from .kernels import apply_kernels, resolve_kernels

    rt = TargetRuntime(model=model, device=torch.device("cpu"), dtype=torch.float32, name=target, tokenizer=tok,
                       cached=cached, source=where)
    rt.info = {"kind": kind, "location": where, "parameters": sum(p.numel() for p in model.parameters()),
               "identity": target_identity(rt)}  # at float32, before any cast or kernel repacking
    model.to(device=dev, dtype=tdtype)
    rt.device, rt.dtype = dev, tdtype
    path = resolve_kernels(kernels, dev, tdtype, rt.hidden_size)
    if path != "eager":
        apply_kernels(model, path)
        rt.kernels = path
    return rt
