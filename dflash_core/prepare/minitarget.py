"""The embedded default target "mini": a small, briefly trained LFM2 built offline.

Why this exists: the test machines cannot reach the Hugging Face hub and the real LFM2 weights
may not be redistributed, yet speculative decoding needs a *trained* target (random weights give
meaningless acceptance rates, and default-init tiny LFM2s just echo tokens). So the lab trains its
own `Lfm2ForCausalLM` -- same hybrid short-conv + GQA architecture as LFM2 -- together with its own
byte-level BPE tokenizer, on a fixed corpus that ships with a pinned dependency: the source of
`transformers==5.24.0` (`transformers/models/*/modeling_*.py`). Everything is deterministic: the
same config gives byte-identical `model.safetensors`.

Tokenizer convention (like LFM2's real tokenizer): ids `<|pad|>`=0, `<|startoftext|>`=1 (BOS),
`<|endoftext|>`=2 (EOS). With `add_special_tokens=True` (the default) encoding prepends BOS and
adds nothing else; with `add_special_tokens=False` it returns the bare text tokens. Training
sequences are `[BOS] + a window of corpus tokens starting at a line start`, which is what a
runtime sees when it encodes a prompt with BOS prepended.

Size choice (docs/mini-target.md has the table, method and samples). Measured on the 2-core AMD
EPYC box, torch 2.13 CPU, `torch.set_num_threads(2)`, fp32 `inference_mode`, cached one-token
decode with `DynamicCache` after a 64-token prefill; "matmul" = self time of aten::mm/addmm/bmm
under torch.profiler / the same weight matmuls timed bare, as a share of the decode step:

    size (hidden/layers/ffn)  params  decode ms/tok  matmul share  train steps/s fp32 | bf16-autocast
    256 / 6 / 768             5.5 M        4.8        49% / 45%          1.94 | 3.41
    384 / 6 / 1152           11.9 M        7.2        61% / 65%          0.88 | 1.62   <- default
    384 / 8 / 1152           15.5 M        9.3        64% / 66%          0.55 | 1.14
    512 / 8 / 1536           27.5 M       14.5        67% / 75%         ~0.1  | (too slow to train)

Why 384/6: it is the largest size whose decode step is clearly compute-bound (~2/3 of the step
in weight matmuls; the rest is the per-layer framework cost, which grows with depth, so going
deeper buys little) while 330 steps of 16x128 tokens still train in ~3.5 min on 2 cores -- with
bf16 autocast, which is 1.8x faster than fp32 training on this CPU and changes nothing at
inference (the saved weights are fp32). It reaches a loss of ~1.65 (from ln 2048 = 7.6) and
greedy continuations are plausible transformers code.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import math
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ArtifactError, BadInputError
from ..progress import Progress
from ..runtime.device import torch_threads as _torch_threads
from ..runtime.precision import train_in_bf16
from ..safeio import normal_modes
from ..store.artifacts import META_FILE, write_target_manifest
from ..store.data import shipped_held_out
from ..store.heldout import check_clean

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # heavy imports happen inside functions; this is for type hints only
    from transformers import Lfm2Config, Lfm2ForCausalLM, PreTrainedTokenizerFast

PINNED_TRANSFORMERS = "5.24.0"
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|pad|>", "<|startoftext|>", "<|endoftext|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)  # ids 0, 1, 2 in this order
PROMPT_FAMILY = "code"  # its corpus is Python source; recorded in META_FILE so a copied folder keeps it
DEMO_PROMPTS = ("def forward(self, hidden_states):", "class Attention(nn.Module):")


@dataclass(frozen=True)
class MiniTargetConfig:
    """Everything that determines the mini target; equal configs give identical weights."""

    vocab_size: int = 2048
    hidden_size: int = 384
    num_layers: int = 6
    attention_layers: tuple[int, ...] = (2, 4)  # the rest are conv
    num_heads: int = 6
    num_kv_heads: int = 2
    intermediate_size: int = 1152
    max_position_embeddings: int = 1024
    seq_len: int = 128
    batch_size: int = 16
    train_seconds: float = 3600.0  # hang guard only: max_steps decides (a busy machine must not change weights)
    max_steps: int = 330
    lr: float = 2e-3
    seed: int = 1234
    corpus_files: int = 400  # how many source files of the corpus
    threads: int = 2
    # bf16 autocast for training only (weights stay fp32), ~1.9x steps/s where the CPU has native bf16. None: the
    # lab's rule (runtime/precision.py: on where native, off where torch would emulate it); True where bf16 would
    # be emulated is refused. build_mini_target records the resolved value in the metadata.
    autocast_bf16: bool | None = None
    # The precision the weights are stored in. The model IS the rounded weights: they are rounded before anything
    # reads them (demo samples, prepare's teacher, drafter and fits) and loaded as float32, so a bf16 file holds
    # the whole model exactly in half the bytes (the shipped reference bundle, docs/mini-target.md).
    store_dtype: str = "bfloat16"


# --------------------------------------------------------------------------------------- corpus


def corpus_files(cfg: MiniTargetConfig = MiniTargetConfig()) -> list[Path]:
    """The first `cfg.corpus_files` `transformers/models/*/modeling_*.py`, sorted by relative path.

    Located through importlib (not a hard-coded path) and pinned to one transformers release,
    because the corpus *is* that release's source: another version silently changes the target.
    """
    installed = importlib.metadata.version("transformers")
    if installed != PINNED_TRANSFORMERS:
        raise ArtifactError(
            f"the mini target's corpus is pinned to transformers=={PINNED_TRANSFORMERS} (its source "
            f"files are the training text), but transformers=={installed} is installed; install "
            f"transformers=={PINNED_TRANSFORMERS} to build the mini target"
        )
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        raise ArtifactError("cannot locate the installed transformers package: reinstall "
                            f"transformers=={PINNED_TRANSFORMERS} to build the mini target")
    models = Path(list(spec.submodule_search_locations)[0]) / "models"
    files = sorted(models.glob("*/modeling_*.py"), key=lambda p: p.relative_to(models).as_posix())
    if len(files) < cfg.corpus_files:
        raise ArtifactError(f"the mini target's corpus needs {cfg.corpus_files} files, found only {len(files)} in "
                            f"{models}: reinstall transformers=={PINNED_TRANSFORMERS}")
    return files[: cfg.corpus_files]


def corpus_texts(cfg: MiniTargetConfig = MiniTargetConfig()) -> list[str]:
    """The fixed offline corpus: one string per source file (see `corpus_files`)."""
    return [p.read_text(encoding="utf-8") for p in corpus_files(cfg)]


def check_corpus(texts: list[str], names: list[str] | None = None) -> None:
    """Refuse a corpus that shares a normalised n-gram with a shipped benchmark or calibration prompt
    (`heldout`, docs/design.md §6): a target that memorised a held-out prompt makes the benchmark measure
    recall. The build and `prepare` (which cuts train seeds from the corpus) both call it."""
    check_clean(texts, shipped_held_out(), "the mini target's corpus", names=names,
                fix="choose benchmark and calibration prompts (data/prompts.json) that are absent from the corpus")


def corpus_sha256(texts: list[str]) -> str:
    """sha256 of the concatenated corpus, recorded so any drift in the corpus is visible."""
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8"))
    return h.hexdigest()


# ------------------------------------------------------------------------------------ tokenizer


def train_tokenizer(texts: list[str], cfg: MiniTargetConfig = MiniTargetConfig()) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style) with `cfg.vocab_size` entries, specials at ids 0/1/2.

    Byte-level so any text (prompts outside the corpus too) round-trips losslessly; BPE training in
    `tokenizers` is deterministic. The wrapper prepends BOS when `add_special_tokens=True` and
    never appends EOS (LFM2 convention).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    got = [tok.token_to_id(s) for s in SPECIAL_TOKENS]
    if got != list(range(len(SPECIAL_TOKENS))):  # a check, not an assert: it must hold under `python -O` too
        raise ArtifactError(f"the trained tokenizer put {SPECIAL_TOKENS} at ids {got}, not 0/1/2: the tokenizers "
                            "release changed BPE training; install the pinned versions (pyproject.toml)")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        add_bos_token=True,
        add_eos_token=False,
        clean_up_tokenization_spaces=False,
        model_max_length=cfg.max_position_embeddings,
    )


# ---------------------------------------------------------------------------------------- model


def model_config(cfg: MiniTargetConfig = MiniTargetConfig(), vocab_size: int | None = None) -> Lfm2Config:
    """The `Lfm2Config` for `cfg`; layer_types is always explicit (the default config has no conv)."""
    from transformers import Lfm2Config

    if not cfg.attention_layers or len(cfg.attention_layers) >= cfg.num_layers:
        raise BadInputError("the mini target needs both conv and attention layers")
    if any(not 0 <= i < cfg.num_layers for i in cfg.attention_layers):
        raise BadInputError(f"attention_layers {cfg.attention_layers} outside 0..{cfg.num_layers - 1}")
    layer_types = ["full_attention" if i in cfg.attention_layers else "conv" for i in range(cfg.num_layers)]
    return Lfm2Config(
        vocab_size=vocab_size if vocab_size is not None else cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        layer_types=layer_types,
        full_attn_idxs=sorted(cfg.attention_layers),
        block_auto_adjust_ff_dim=False,  # FFN width is exactly intermediate_size
        tie_word_embeddings=True,  # a.k.a. tie_embedding in LFM2 checkpoints
        conv_L_cache=3,
        conv_bias=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        dtype="float32",
    )


def _encode_corpus(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> list[list[int]]:
    """Token ids per file, without specials (BOS is added per training window)."""
    return [e.ids for e in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)]


def _training_stream(tokenizer: PreTrainedTokenizerFast, docs: list[list[int]], seq_len: int):
    """One flat token stream (files joined by EOS) plus the window starts that begin a line.

    Starting windows at line starts makes BOS + "def ..."/"class ..." prompts in-distribution.
    """
    import torch

    eos = tokenizer.eos_token_id
    flat: list[int] = []
    for d in docs:
        flat.extend(d)
        flat.append(eos)
    stream = torch.tensor(flat, dtype=torch.long)
    vocab = tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=True)
    ends_line = torch.zeros(vocab, dtype=torch.bool)
    for i in range(vocab):
        ends_line[i] = "\n" in tokenizer.backend_tokenizer.decode([i], skip_special_tokens=False)
    ends_line[eos] = True
    prev = ends_line[stream[:-1]]
    starts = torch.nonzero(prev, as_tuple=False).flatten() + 1
    starts = starts[starts + seq_len <= stream.numel()]
    return stream, starts


def _lr_at(step: int, cfg: MiniTargetConfig) -> float:
    """Linear warmup (5% of steps, >=1) then cosine decay to 10% of lr, over max_steps."""
    warm = max(1, cfg.max_steps // 20)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    t = (step - warm) / max(1, cfg.max_steps - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * t)))


def train_model(
    tokenizer: PreTrainedTokenizerFast,
    texts: list[str],
    cfg: MiniTargetConfig = MiniTargetConfig(),
    progress: bool = True,
) -> tuple[Lfm2ForCausalLM, dict[str, Any]]:
    """Train the LFM2 on the corpus; return (model in eval mode, training stats).

    Deterministic by construction: fixed seeds, a private torch.Generator for batch sampling, a
    fixed thread count and a step-count stop. The wall-clock cap only guards against a slow
    machine; when it fires the result is *not* reproducible and `time_cap_hit` says so.
    """
    import torch
    from transformers import Lfm2ForCausalLM

    cfg = resolve_autocast(cfg)
    # fork_rng: seeding here must not disturb the caller's global RNG stream
    with _torch_threads(cfg.threads), torch.random.fork_rng(devices=[]):
        docs = _encode_corpus(tokenizer, texts)
        stream, starts = _training_stream(tokenizer, docs, cfg.seq_len)
        bos = torch.full((cfg.batch_size, 1), tokenizer.bos_token_id, dtype=torch.long)
        offs = torch.arange(cfg.seq_len)

        torch.manual_seed(cfg.seed)
        model = Lfm2ForCausalLM(model_config(cfg, vocab_size=len(tokenizer))).float()
        model.train()
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)

        losses: list[float] = []
        t0 = time.perf_counter()
        cap_hit = False
        bar = Progress("mini target", cfg.max_steps, log, show=progress)
        for step in range(cfg.max_steps):
            if time.perf_counter() - t0 > cfg.train_seconds:
                cap_hit = True
                break
            pick = starts[torch.randint(len(starts), (cfg.batch_size,), generator=gen)]
            seq = torch.cat([bos, stream[pick[:, None] + offs[None, :]]], dim=1)  # [B, seq_len+1]
            for g in opt.param_groups:
                g["lr"] = _lr_at(step, cfg)
            losses.append(_train_step(model, opt, seq, cfg))
            bar.update(1, f"loss {losses[-1]:.3f}")
        wall = time.perf_counter() - t0
        model.eval()
    tail = losses[-20:]
    stats = {
        "steps": len(losses),
        "final_loss": sum(tail) / len(tail) if tail else float("nan"),
        "loss_curve": [round(x, 4) for x in losses[:: max(1, len(losses) // 40)]],
        "train_seconds": wall,
        "time_cap_hit": cap_hit,
        "corpus_tokens": int(stream.numel()),
        "window_starts": int(starts.numel()),
    }
    return model, stats


def build_mini_target(
    out_dir: str | Path, cfg: MiniTargetConfig = MiniTargetConfig(), progress: bool = True
) -> dict[str, Any]:
    """Train tokenizer + model and `save_pretrained` both into out_dir (safetensors in cfg.store_dtype, bf16 by
    default: the weights are rounded once, right after training, and every later reader sees the rounded values).

    Returns metadata (also written to out_dir/mini_target_meta.json) so a run can be audited:
    config, steps, final loss (mean of the last 20 steps), wall seconds, parameter count, corpus
    description and sha256, tokenizer vocab size, greedy demo samples.
    """
    t0 = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = resolve_autocast(cfg)  # before anything is trained, so the metadata records the precision used
    texts = corpus_texts(cfg)
    check_corpus(texts, [p.name for p in corpus_files(cfg)])
    tokenizer = train_tokenizer(texts, cfg)
    model, stats = train_model(tokenizer, texts, cfg, progress=progress)
    round_weights(model, cfg.store_dtype)
    with _torch_threads(cfg.threads):
        samples = {p: _greedy(model, tokenizer, p, 48) for p in DEMO_PROMPTS}
    meta: dict[str, Any] = {
        "prompt_family": PROMPT_FAMILY,
        "config": asdict(cfg),
        "steps": stats["steps"],
        "final_loss": stats["final_loss"],
        "time_cap_hit": stats["time_cap_hit"],
        "train_seconds": stats["train_seconds"],
        "wall_seconds": time.perf_counter() - t0,
        "parameters": sum(p.numel() for p in model.parameters()),
        "corpus": {
            "description": f"first {cfg.corpus_files} of sorted transformers/models/*/modeling_*.py "
            f"from transformers=={PINNED_TRANSFORMERS}",
            "files": cfg.corpus_files,
            "chars": sum(len(t) for t in texts),
            "tokens": stats["corpus_tokens"],
            "sha256": corpus_sha256(texts),
        },
        "tokenizer_vocab_size": len(tokenizer),
        "versions": {m: importlib.metadata.version(m) for m in ("torch", "transformers", "tokenizers")},
        "loss_curve": stats["loss_curve"],
        "samples": samples,
    }
    # Write into a sibling temp dir, then move files in with config.json last: callers treat
    # "config.json exists" as "target is built", so an interrupted build never looks complete.
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.tmp-") as tmp:
        _save_stored(model, tmp, cfg.store_dtype)
        tokenizer.save_pretrained(tmp)
        Path(tmp, META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        write_target_manifest(tmp)  # SHA-256 + size of every file: a flipped byte is refused at load
        normal_modes(tmp)  # save_pretrained writes model.safetensors 0600: others sharing the home could not read it
        (out / "config.json").unlink(missing_ok=True)
        names = sorted(p.name for p in Path(tmp).iterdir())
        for name in [n for n in names if n != "config.json"] + ["config.json"]:
            shutil.move(str(Path(tmp, name)), str(out / name))
    return meta


STORE_DTYPES = ("float32", "bfloat16", "float16")


def round_weights(model, store_dtype: str) -> None:
    """Round every float weight to `store_dtype` and back to float32, in place: what is saved and what is used
    afterwards are then the same numbers (bf16 and fp16 convert to fp32 exactly)."""
    import torch

    if store_dtype not in STORE_DTYPES:
        raise BadInputError(f"store_dtype {store_dtype!r} is not one of {', '.join(STORE_DTYPES)}")
    dt = getattr(torch, store_dtype)
    with torch.no_grad():  # what is saved (parameters, persistent buffers); not rotary tables rebuilt at load
        for t in model.state_dict().values():
            if t.is_floating_point():
                t.copy_(t.to(dt).float())


def _save_stored(model, out: str | Path, store_dtype: str) -> None:
    """save_pretrained in the storage dtype (a copy is cast: the caller's model keeps its float32 buffers). Its
    values are already rounded (`round_weights`), so the cast loses nothing."""
    import torch

    copy.deepcopy(model).to(getattr(torch, store_dtype)).save_pretrained(out, safe_serialization=True)


# ------------------------------------------------------------------------------------ sampling


def _greedy(model: Lfm2ForCausalLM, tokenizer: PreTrainedTokenizerFast, prompt: str, n_tokens: int) -> str:
    """Greedy continuation (text of the new tokens only) with BOS prepended to the prompt."""
    import torch

    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=True)["input_ids"]
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=False)


def sample_greedy(out_dir: str | Path, prompt: str, n_tokens: int = 48) -> str:
    """Demo/check: load a built target with `from_pretrained` (offline) and greedy-continue prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out_dir), local_files_only=True, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(str(out_dir), local_files_only=True, dtype="float32",
                                                 trust_remote_code=False)
    model.eval()
    return _greedy(model, tokenizer, prompt, n_tokens)


def _train_step(model, opt, seq, cfg: MiniTargetConfig) -> float:
    """One next-token step on seq [B, T+1] (bf16 autocast when configured, grad clip 1.0); returns the loss.
    Shared by training and studies/2026-11-29-mini-target-size/'s script, so the measured step is the real one."""
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(resolve_autocast(cfg).autocast_bf16)):
        logits = model(input_ids=seq[:, :-1], use_cache=False).logits
    logits = logits.float().reshape(-1, logits.shape[-1])
    loss = torch.nn.functional.cross_entropy(logits, seq[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def resolve_autocast(cfg: MiniTargetConfig) -> MiniTargetConfig:
    """cfg with `autocast_bf16` decided by the lab's bf16 rule (None: native bf16 only; True: refused where bf16
    would be emulated, since a 2-hour emulated build is never what a user asked for)."""
    native = train_in_bf16("cpu")
    if cfg.autocast_bf16 is None:
        return replace(cfg, autocast_bf16=native)
    if cfg.autocast_bf16 and not native:
        raise BadInputError("the mini target's bf16 autocast was asked for on a CPU without native bf16 (no "
                            "avx512_bf16/amx_bf16 flag): torch would emulate it ~60x slower; leave autocast_bf16 "
                            "unset (None) to train in float32")
    return cfg


def with_size(cfg: MiniTargetConfig, **changes: Any) -> MiniTargetConfig:
    """Convenience: a copy of cfg with some fields changed (the dataclass is frozen)."""
    return replace(cfg, **changes)
