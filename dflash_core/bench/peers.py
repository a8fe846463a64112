"""Reference rows of the benchmark (peers and bounds measured in the same run, not methods).

`generate` (transformers' greedy loop), `prompt_lookup` and `assisted` (transformers' own speculative
decoders) and `dflash_transformers` (transformers' own DFlash generation, `speculation_type="dflash"`, with
the same drafter weights as the lab's methods) are the peers; `oracle-w<w>` (drafts that replay greedy,
tau = w + 1) is the upper bound of the lab's own loop at width w. Each runner makes one pass over the
benchmark prompts and returns (outputs, wall seconds); `measure_reference` pairs it with `normal`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ..prepare.drafter_format import to_hf_model
from ..prepare.prepared import DRAFTER_FILE, drafter_dtype
from ..runtime.decode import speculative
from ..runtime.device import synchronize, torch_threads
from ..runtime.drafter import DFlashDrafter, DrafterConfig
from ..runtime.proposers import OracleProposer
from ..store.artifacts import load_tensor_file
from .costmodel import verify_times
from .rounds import paired_rounds, verdict_fields, verdicts

if TYPE_CHECKING:
    from .state import BenchSession

REFERENCES = ("generate", "prompt_lookup", "assisted", "dflash_transformers")


def early_exit_assistant(rt, layers: int | None = None):
    """An assistant for transformers' assisted decoding: the target's first `layers` layers + its norm/head.

    Assisted decoding needs a second model with the target's vocabulary, and no smaller LFM2 exists for
    the mini target (or for a random-weight 350M). A truncated copy of the target is the one assistant
    every target has without training (self-speculative early exit); it is a peer row, not a method.
    """
    import torch

    n = layers if layers is not None else max(1, rt.num_layers // 2)
    m = copy.deepcopy(rt.model)
    m.model.layers = torch.nn.ModuleList(list(m.model.layers)[:n])
    m.config.num_hidden_layers = n
    if getattr(m.config, "layer_types", None) is not None:  # LFM2's per-layer kinds; a Llama config has none
        m.config.layer_types = list(m.config.layer_types)[:n]
    return m.eval()


def transformers_dflash_assistant(rt, prepared):
    """The prepared drafter as transformers' `MuseGlimmerAssistantModel`, on the target's device and dtype.

    Built from the drafter artifact itself (not the loaded module, which may carry repacked kernels), so the
    weights are exactly the ones the lab's methods draft with. transformers feeds the assistant the target's
    embeddings and hidden states unconverted, so beside a float16 / bfloat16 target (where the lab's drafter runs
    in float32, `prepared.drafter_dtype`) the assistant runs in float32 too, its inputs cast up and its hidden
    states cast back to the target's dtype for the target's head (`cast_io`): the row compares implementations,
    not precisions.
    """
    blob = load_tensor_file(prepared.directory / DRAFTER_FILE)
    drafter = DFlashDrafter(DrafterConfig.from_dict(blob["config"]))
    drafter.load_state_dict(blob["state_dict"])
    dt = drafter_dtype(rt.dtype)
    model = to_hf_model(drafter.to(device=rt.device, dtype=dt), rt.config)
    return cast_io(model, dt, rt.dtype) if dt != rt.dtype else model


def cast_io(model, inner, outer):
    """`model` computing in `inner` between callers that speak `outer`: floating inputs cast to `inner` before its
    forward, floating outputs cast to `outer` after it (forward hooks: the module itself is unchanged)."""
    import torch

    def cast(x, dtype):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.to(dtype)
        if isinstance(x, tuple):
            return tuple(cast(v, dtype) for v in x)
        return x

    def before(_mod, args, kwargs):
        return tuple(cast(a, inner) for a in args), {k: cast(v, inner) for k, v in kwargs.items()}

    def after(_mod, _args, out):
        if isinstance(out, tuple):
            return cast(out, outer)
        for k in list(out.keys()):  # a ModelOutput: its tensors in place
            out[k] = cast(out[k], outer)
        return out

    model.register_forward_pre_hook(before, with_kwargs=True)
    model.register_forward_hook(after)
    return model


@contextmanager
def eos_unset(model) -> Iterator[None]:
    """The model's generation config without an EOS id for the duration.

    The lab's greedy decodes exactly `tokens` ids, EOS or not; `generate` stops at EOS, and `min_new_tokens`
    keeps it going only by forbidding EOS, which changes the output wherever greedy emits it (SmolLM2's
    `<|im_end|>` did on a benchmark prompt). Passing `eos_token_id=None` does not help: generate fills a
    passed config's None values from `model.generation_config`, so it is unset there and restored after.
    """
    gc = model.generation_config
    saved = gc.eos_token_id
    gc.eos_token_id = None
    try:
        yield
    finally:
        gc.eos_token_id = saved


@contextmanager
def counted_calls(model) -> Iterator[list[int]]:
    """Every forward of the target `model` while inside: the list of each call's input length (tokens fed), so a
    peer's tokens per target call and its verify width are counted, not assumed. A pre-hook costs about a
    microsecond per call against milliseconds of forward."""
    lengths: list[int] = []

    def hook(_module, args, kwargs):
        x = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else (args[0] if args else None)
        if x is None:
            x = kwargs.get("inputs_embeds")
        lengths.append(int(x.shape[1]) if x is not None and getattr(x, "ndim", 0) >= 2 else 0)

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield lengths
    finally:
        handle.remove()


def call_figures(calls: list[list[int]], tokens: int) -> dict:
    """A peer pass's target calls as the lab counts its own (docs/methodology.md, "Tokens per target call"): per
    prompt, the first call is the prefill (it commits one token), every later call verifies. `width`: the most
    drafts one verify fed (its input length minus the token it continues from)."""
    n, p = sum(len(c) for c in calls), len(calls)
    verify = [x for c in calls for x in c[1:]]
    return {"target_calls": n, "new_tokens": tokens * p, "prompts": p,
            "tokens_per_target_call": tokens * p / n if n else 0.0,
            "width": max(verify) - 1 if verify else 0}


def generate_all(rt, prompt_ids: list[list[int]], tokens: int, calls: list | None = None,
                 **gen_kwargs: Any) -> tuple[list[list[int]], float]:
    """transformers' `generate` (greedy, exactly `tokens` new tokens, EOS an ordinary id as in the lab's
    greedy) over every prompt; wall seconds summed. `calls`, when given, receives each prompt's target-call input
    lengths (counted_calls)."""
    import torch

    outs, wall = [], 0.0
    pad = rt.config.pad_token_id if rt.config.pad_token_id is not None else 0
    with eos_unset(rt.model):  # once for the pass, outside the timed calls
        for p in prompt_ids:
            inp = torch.tensor([p], device=rt.device)
            with counted_calls(rt.model) as lengths:
                synchronize(rt.device)
                t0 = time.perf_counter()
                with torch.inference_mode():
                    g = rt.model.generate(inp, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                          pad_token_id=pad, **gen_kwargs)
                synchronize(rt.device)
                wall += time.perf_counter() - t0
            if calls is not None:
                calls.append(list(lengths))
            outs.append(g[0, len(p):].tolist())
    return outs, wall


def oracle_all(rt, prompt_ids: list[list[int]], references: list[list[int]], tokens: int,
               width: int) -> tuple[list[list[int]], float]:
    """The lab's loop with drafts that replay greedy: every draft accepted, the best width w can do."""
    outs, wall = [], 0.0
    for p, ref in zip(prompt_ids, references):
        ids, st = speculative(rt, OracleProposer(p, ref, rt.vocab_size), p, tokens, width, method="oracle")
        outs.append(ids)
        wall += st.wall_seconds
    return outs, wall


def reference_runner(rt, prompt_ids: list[list[int]], references: list[list[int]], tokens: int, kind: str,
                     prepared=None, calls: list | None = None) -> Callable[[], tuple[list[list[int]], float]]:
    """A callable returning (outputs, wall seconds) for one pass of reference `kind` over the prompts
    (`prepared`: the artifacts, which `dflash_transformers` takes its drafter from; `calls`: receives the target
    calls of transformers' passes, counted_calls)."""
    if kind == "generate":
        return lambda: generate_all(rt, prompt_ids, tokens, calls)
    if kind == "prompt_lookup":
        return lambda: generate_all(rt, prompt_ids, tokens, calls, prompt_lookup_num_tokens=4)
    if kind == "assisted":
        assistant = early_exit_assistant(rt)
        return lambda: generate_all(rt, prompt_ids, tokens, calls, assistant_model=assistant)
    if kind == "dflash_transformers":
        if prepared is None:
            raise ValueError("the dflash_transformers reference needs the prepared drafter")
        drafter = transformers_dflash_assistant(rt, prepared)
        return lambda: generate_all(rt, prompt_ids, tokens, calls, assistant_model=drafter,
                                    speculation_type="dflash")
    if kind.startswith("oracle-w"):
        w = int(kind[len("oracle-w"):])
        return lambda: oracle_all(rt, prompt_ids, references, tokens, w)
    raise ValueError(f"unknown reference {kind!r}")


# --- the rows timed beside the methods ----------------------------------------------------------------

def measure_reference(sess: BenchSession, kind: str, rounds: int, benchmark=None) -> dict:
    """Time reference `kind` (dflash_core.bench.peers) against `normal` in `rounds` paired rounds."""
    calls: list[list[int]] = []
    runner = reference_runner(sess.rt, sess.prompt_ids, sess.greedy_outputs, sess.cfg.tokens, kind, sess.prepared,
                              calls)

    def run():
        calls.clear()  # the last pass's calls: every pass of one greedy workload makes the same ones
        outs, wall = runner()
        return wall, outs

    with torch_threads(sess.cfg.threads):
        pr = paired_rounds(sess, run, rounds, benchmark)
    figs = pr.figures(sess.cfg.tokens * len(sess.prompt_ids))
    return {"reference": kind, "device": sess.rt.device.type,
            **{k: figs[k] for k in ("tokens_per_second", "tokens_per_second_iqr", "speedup", "speedup_iqr",
                                    "speedup_rounds", "rounds")},
            **(call_figures(calls, sess.cfg.tokens) if calls else {}),
            **verdict_fields(verdicts(sess, pr.results[0]))}


VERIFY_CURVE_CALLS = 12  # timed calls per point of the verify-cost curve (bench.budget prices them)


def verify_cost_curve(sess: BenchSession, widths: list[int], calls: int = VERIFY_CURVE_CALLS) -> dict:
    """t_verify(w) / t_decode at the first prompt's context: what a block verify costs in decode steps.

    Steady state, as inside the loop: one recording session, warmed by a verify, then each timed verify of
    `block_len` rows is rolled back whole so the context stays put (the first forward after a prefill is
    slower and would inflate both numbers).
    """
    with torch_threads(sess.cfg.threads):
        return _verify_cost_curve(sess, widths, calls)


def _verify_cost_curve(sess: BenchSession, widths: list[int], calls: int) -> dict:
    p = sess.prompt_ids[0] + sess.greedy_outputs[0][: max(0, sess.cfg.tokens // 2)]
    t = verify_times(sess.rt, p, sorted({1, *(w + 1 for w in widths)}), calls)
    curve = {str(w): float(t[w + 1] / t[1]) for w in widths}
    return {"t_decode_seconds": float(t[1]), "ratio": curve, "calls_per_point": calls}
