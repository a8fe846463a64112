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

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BadInputError, TargetNotFoundError
from .device import resolve_device, resolve_dtype

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

# Files a hub snapshot needs: config, safetensors weights, tokenizer. No *.py (the lab never runs a
# checkpoint's code) and no pickled *.bin weights.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "vocab.txt", "special_tokens_map.json")


def resolve_target_source(target: str, home: str | Path | None = None) -> tuple[str, str]:
    """Return (kind, location): kind is 'mini', 'local' or 'hub'. Unknown names raise with the options."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    from .. import DEFAULT_HUB_TARGET

    if not isinstance(target, str) or not target.strip():
        raise TargetNotFoundError("empty target name: use 'mini', a local checkpoint directory, or a hub id "
                                  f"such as {DEFAULT_HUB_TARGET}")
    if target == "mini":
        from ..prepare.artifacts import mini_target_dir

        return "mini", str(mini_target_dir(home))
    p = Path(target).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise TargetNotFoundError(f"target directory {p} has no config.json: point --target at a directory "
                                      "written by save_pretrained()")
        return "local", str(p)
    unknown = (f"unknown target {target!r}: not 'mini', not an existing directory, and not a hub id of the form "
               f"owner/name (e.g. {DEFAULT_HUB_TARGET})")
    # A bare word is far likelier a typo of 'mini' or a missing folder than a legacy un-namespaced hub alias.
    if target.startswith((".", "/", "~")) or target.count("/") != 1:
        raise TargetNotFoundError(unknown)
    try:
        validate_repo_id(target)  # the hub's own rule (dots, dashes, lengths), not a guess from file suffixes
    except HFValidationError as exc:
        raise TargetNotFoundError(f"{unknown}; {exc}") from exc
    return "hub", target


def _hub_snapshot(repo_id: str, revision: str | None) -> Path:
    """The local snapshot folder of a hub id (downloaded when online, from the cache when HF_HUB_OFFLINE=1)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS))
    except Exception as exc:  # any hub failure (offline, not cached, unknown repo or revision, HTTP) means the same
        at = f" at revision {revision!r}" if revision else ""
        raise TargetNotFoundError(
            f"could not load {repo_id!r}{at} from the Hugging Face hub or its local cache ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}). Without hub access, download the checkpoint "
            "elsewhere, copy the directory here and pass --target /path/to/checkpoint (any directory written by "
            "save_pretrained with config.json and weights).") from exc


def _checkpoint_meta(where: Path, error) -> dict:
    """Facts the checkpoint states about itself: the lab's mini target (and any copy of it) carries
    mini_target_meta.json, whose prompt family is 'code' (its corpus is Python source)."""
    from ..prepare.minitarget import META_FILE
    from ..safeio import read_json

    path = where / META_FILE
    if not path.exists():
        return {"family": None, "mini_corpus_files": None, "mini_seed": None}
    fix = "restore it or delete the file"
    meta = read_json(path, "checkpoint metadata", error, fix, max_bytes=16 << 20)
    try:
        files = int(meta.get("config", {}).get("corpus_files", 400))
        if not 1 <= files <= 100_000:
            raise ValueError(f"corpus_files {files} outside 1..100000")
        seed = meta.get("config", {}).get("seed")
        if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 1 << 63):
            raise ValueError(f"seed {str(seed)[:40]!r} is not an integer in 0..2**63-1")
        return {"family": str(meta.get("prompt_family", "code"))[:64], "mini_corpus_files": files, "mini_seed": seed}
    except (ValueError, AttributeError, TypeError, OverflowError) as exc:
        raise error(f"{path} is not valid checkpoint metadata ({exc}): {fix}") from exc


# Bounds on a target's config, checked before `from_pretrained` allocates anything (a config.json asking for
# 100,000 layers allocated until the machine ran out of memory). LFM2.5-350M: 16 layers, hidden 1024, vocab 65536.
TARGET_LIMITS = {"num_hidden_layers": 256, "hidden_size": 65536, "intermediate_size": 262144,
                 "vocab_size": 1 << 21, "num_attention_heads": 1024, "num_key_value_heads": 1024,
                 "max_position_embeddings": 1 << 24}
MAX_TARGET_PARAMETERS = 10_000_000_000
CHECKPOINT_SUFFIXES = (".json", ".safetensors", ".model", ".txt", ".jinja", ".tiktoken")


def check_checkpoint(where: Path, error) -> dict:
    """What can be checked of a checkpoint directory without loading it: every file transformers may open is a
    regular file (a FIFO or a link to /dev/zero hangs the loader), config.json is bounded JSON, asks for no code
    of its own (`auto_map`: refused, as the README says, whatever the weights) and for a model of sane size."""
    from ..safeio import check_regular_file, read_json

    fix = f"restore the checkpoint in {where} (files must be plain files)"
    for p in sorted(where.iterdir()):
        if p.name.endswith(CHECKPOINT_SUFFIXES):
            check_regular_file(p, "checkpoint file", error, fix)
    cfg = read_json(where / "config.json", "checkpoint config", error, fix, max_bytes=16 << 20)
    if not isinstance(cfg, dict):
        raise error(f"{where / 'config.json'} is not a JSON object: {fix}")
    if "auto_map" in cfg:
        raise error(f"the checkpoint in {where} asks to run its own Python code (auto_map in config.json); the lab "
                    "never runs a checkpoint's code (trust_remote_code=False): use a checkpoint of an architecture "
                    "transformers ships (e.g. LFM2)")
    for k, hi in TARGET_LIMITS.items():
        v = cfg.get(k)
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= hi):
            raise error(f"{where / 'config.json'}: {k} is {str(v)[:40]!r}, not an integer in 1..{hi}: {fix}")
    H, L = cfg.get("hidden_size") or 0, cfg.get("num_hidden_layers") or 0
    params = (cfg.get("vocab_size") or 0) * H + L * (4 * H * H + 3 * H * (cfg.get("intermediate_size") or 4 * H))
    if params > MAX_TARGET_PARAMETERS:
        raise error(f"{where / 'config.json'} describes about {params:.3g} parameters, more than the "
                    f"{MAX_TARGET_PARAMETERS:.0e} this lab loads: {fix}")
    return cfg


def _load_model(where: Path, error):
    import torch
    from transformers import AutoModelForCausalLM

    check_checkpoint(where, error)
    try:
        # Loaded in float32 first: the artifact identity is a property of the checkpoint, so it is hashed at
        # one precision whatever dtype the run uses (prepare works in float32; a float16/bfloat16 run must
        # find the same artifacts). Then cast and moved.
        return AutoModelForCausalLM.from_pretrained(str(where), dtype=torch.float32, trust_remote_code=False,
                                                    local_files_only=True)
    except Exception as exc:  # a user-supplied checkpoint can fail in many ways; each becomes one clear error
        msg = str(exc).splitlines()[0][:240] if str(exc) else ""
        if "trust_remote_code" in str(exc) or "auto_map" in _read_text(where / "config.json"):
            raise error(f"the checkpoint in {where} asks to run its own Python code (auto_map in config.json); "
                        "the lab never runs a checkpoint's code (trust_remote_code=False): use a checkpoint of an "
                        "architecture transformers ships (e.g. LFM2)") from exc
        weights = sorted(p.name for p in where.glob("*.safetensors"))
        if type(exc).__name__ == "SafetensorError":
            raise error(f"the weights {', '.join(weights) or '(none)'} in {where} are unreadable (truncated or "
                        f"corrupt: {msg}): re-save or re-download the checkpoint") from exc
        raise error(f"could not load the checkpoint in {where} ({type(exc).__name__}: {msg})") from exc


def _read_text(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except (OSError, ValueError):
        return ""


def _load_tokenizer(where: Path, error):
    """The checkpoint's tokenizer, or None when it ships none (a weights-only save). A tokenizer that is
    present but broken is an error naming the file, not a silent 'no tokenizer'."""
    from transformers import AutoTokenizer

    present = [f for f in TOKENIZER_FILES if (where / f).is_file()]
    if not present:
        return None
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if name in present:
            try:
                json.loads((where / name).read_text("utf-8"))
            except (OSError, ValueError) as exc:
                raise error(f"{where / name} is not valid JSON ({exc}): the tokenizer is corrupt; restore the "
                            "file (for the mini target: `python -m dflash_core prepare --target mini --refresh`)"
                            ) from exc
    try:
        return AutoTokenizer.from_pretrained(str(where), trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # tokenizers raises plain Exception for a malformed file
        raise error(f"the tokenizer in {where} ({', '.join(present)}) could not be loaded ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:200] if str(exc) else ''}): restore those files") from exc


def load_target(target: str = "mini", device: str = "cpu", dtype: str | None = None, *, cached: bool = True,
                home: str | Path | None = None, kernels: str = "eager", revision: str | None = None
                ) -> TargetRuntime:
    """Load a target by alias, local directory or hub id through `from_pretrained`, on a device and dtype.

    `revision` (hub ids only) is a branch, tag or commit; the resolved commit is recorded in `rt.info` and in
    the target identity, so reports name the exact weights. A directory with a `target_manifest.json` (the
    mini target and copies of it) is verified file by file before anything is loaded.
    """
    import torch

    from ..errors import ArtifactError
    from ..prepare.artifacts import TARGET_MANIFEST, compute_identity, reading_lock, verify_target_files

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
    from .kernels import apply_kernels, resolve_kernels

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
    if kpath != "eager":
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


def batch_teacher(rt: TargetRuntime, prompts: Sequence[Sequence[int]], new_tokens: int, taps: Sequence[int] = (),
                  top_k: int = 0) -> tuple[list[list[int]], Any, Any]:
    """`batch_greedy`, plus what drafter training needs from the same forwards (no second pass over the data):

    * taps [n, plen + new_tokens - 1, n_taps * hidden]: the hidden-state taps of every row the target was fed
      (the prompt, then each generated token but the last, which no forward reads), as `batch_taps` gives them
      up to the cached forwards' summation order;
    * top-k (values, ids) [n, new_tokens, k] of the target's logits at rows plen-1 .. plen+new_tokens-2, i.e.
      the distribution each generated token was the argmax of (float32 values).
    Either is None when not asked for (`taps=()`, `top_k=0`).
    """
    import torch
    from transformers import DynamicCache

    lens = {len(p) for p in prompts}
    if len(lens) != 1 or 0 in lens:
        raise BadInputError(f"batch_greedy needs non-empty prompts of one length, got lengths {sorted(lens)}: "
                            "bucket the prompts by length first (train.trajectories does)")
    if new_tokens <= 0:
        return [[] for _ in prompts], None, None
    cache = DynamicCache(config=rt.model.config)
    inp = torch.tensor([list(p) for p in prompts], dtype=torch.long, device=rt.device)
    kwargs: dict[str, Any] = {"output_hidden_states": [int(t) + 1 for t in taps]} if taps else {}
    cols, hid, top_v, top_i = [], [], [], []
    with torch.inference_mode():
        for _ in range(new_tokens):
            out = rt.model(input_ids=inp, cache=cache, use_cache=True, logits_to_keep=1, **kwargs)
            last = out.logits[:, -1]
            if top_k:
                v, i = torch.topk(last.float(), min(int(top_k), last.shape[-1]), dim=-1)
                top_v.append(v.cpu())
                top_i.append(i.cpu())
            if taps:  # every forward feeds rows whose taps are needed (the last generated token is never fed)
                hid.append(torch.cat([out.hidden_states[int(t) + 1] for t in taps], dim=-1).cpu())
            inp = last.argmax(dim=-1, keepdim=True)
            cols.append(inp)
    hidden = torch.cat(hid, dim=1) if taps else None
    tops = (torch.stack(top_v, 1), torch.stack(top_i, 1)) if top_k else None
    return torch.cat(cols, dim=1).tolist(), hidden, tops


def batch_taps(rt: TargetRuntime, seqs: Sequence[Sequence[int]], taps: Sequence[int]) -> list[Any]:
    """Hidden-state taps of every row of equal-length sequences, one uncached forward for the batch
    (the same rows `TargetSession.prefill(..., taps=...)` returns for each sequence alone)."""
    import torch

    lens = {len(s) for s in seqs}
    if len(lens) != 1 or 0 in lens:
        raise BadInputError(f"batch_taps needs non-empty sequences of one length, got lengths {sorted(lens)}")
    inp = torch.tensor([list(s) for s in seqs], dtype=torch.long, device=rt.device)
    with torch.inference_mode():
        out = rt.model(input_ids=inp, use_cache=False, logits_to_keep=1,
                       output_hidden_states=[int(t) + 1 for t in taps])
        hidden = torch.cat([out.hidden_states[int(t) + 1] for t in taps], dim=-1).cpu()
    return list(hidden.unbind(0))
