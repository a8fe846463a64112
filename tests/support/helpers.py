"""Helpers the test modules share (no test module imports from another): the one greedy-reference cache,
a kernel path's exactness contract, the decode-stats invariants, crafted logits and the recording pair scorer
for the selection rules, and the loader of a repository script."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from hypothesis import strategies as st

from dflash_core.methods import get_method
from dflash_core.runtime.decode import DecodeStats, greedy, speculative

from .strategies import MAX_BUDGET, method_options, prompts

REPO = Path(__file__).resolve().parents[2]


def load_file(relpath: str):
    """The repository file `relpath` (a tool in scripts/, a study's script) loaded as a module from its path.
    Why: scripts/ and a study folder are not packages, and no test edits sys.path to reach one (a module found by
    name could be another checkout's)."""
    import importlib.util
    import sys

    name = "_repo_file_" + re.sub(r"\W", "_", relpath)
    spec = importlib.util.spec_from_file_location(name, REPO / relpath)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses and pickling look their module up by name
    spec.loader.exec_module(mod)
    return mod


@lru_cache(maxsize=4096)
def reference(rt, prompt: tuple[int, ...], budget: int = MAX_BUDGET) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Greedy ids and top-2 gaps of `prompt` for `budget` tokens (no EOS stop), cached per runtime.

    Callers slice: the first n ids of a longer run are the greedy ids for budget n.
    """
    ids, stats = greedy(rt, list(prompt), budget, record_margins=True)
    return tuple(ids), tuple(stats.margins)


def check_path_exactness(rt, eager, vocab: int, tokens: int = 40) -> None:
    """A linear-layer path's contract on a float32 model: its greedy equals `eager`'s greedy up to certified ties,
    and speculative decoding with exact and with corrupted oracle drafts equals its own greedy, at widths 1, 3, 6."""
    import torch

    from dflash_core.runtime.decode import speculative
    from dflash_core.runtime.exactness import classify
    from dflash_core.runtime.proposers import OracleProposer

    prompt = [1, 7, 9, 11, 13, 17, 19]
    ref_e, st_e = greedy(eager, prompt, tokens, record_margins=True)
    ref, st = greedy(rt, prompt, tokens, record_margins=True)
    assert classify(ref, ref_e, st_e.margins, torch.float32).ok
    for w in (1, 3, 6):
        for corrupt in (frozenset(), frozenset({2, 5, 9, 14, 20})):
            got, _ = speculative(rt, OracleProposer(tuple(prompt), tuple(ref), vocab, corrupt), prompt, tokens, w)
            assert classify(got, ref, st.margins, torch.float32).kind == "exact", (w, sorted(corrupt))


def check_invariants(stats: DecodeStats, width: int, budget: int) -> None:
    assert stats.new_tokens == budget
    assert stats.accepted <= stats.proposed
    assert sum(stats.accept_counts) == stats.target_calls
    assert len(stats.accept_counts) == width + 1
    assert stats.proposed <= stats.draft_calls * width
    if stats.target_calls:
        assert stats.tokens_per_target_call <= width + 1
    # every target call commits accepted + 1 tokens, so the histogram accounts for every token
    committed = sum((a + 1) * c for a, c in enumerate(stats.accept_counts))
    assert committed == budget
    assert all(a <= p for a, p in zip(stats.position_accepted, stats.position_proposed))


def crafted_logits(margins: list[float], V: int, seed: int = 0):
    """Rows whose argmax is a random id and whose top1-top2 gap is exactly the given margin."""
    import torch

    g = torch.Generator().manual_seed(seed)
    rows = []
    for m in margins:
        r = torch.rand(V, generator=g, dtype=torch.float64)  # in [0, 1)
        top = int(torch.randint(V, (1,), generator=g))
        r[top] = float(r.max()) + 1.0  # unique max
        second = float(torch.cat([r[:top], r[top + 1:]]).max())
        r[top] = second + m
        rows.append(r)
    return torch.stack(rows)


class RecordingScorer:
    """Same interface as PairScorer; pair(p→c) from a plain function, every call recorded."""

    def __init__(self, fn=lambda p, c: 0.0):
        self.fn = fn
        self.calls: list[tuple] = []
        self.count = 0

    def __call__(self, left, rights):
        self.calls.append(("fwd", left, tuple(rights)))
        self.count += len(rights)
        return [self.fn(left, r) for r in rights]

    def into(self, lefts, right):
        self.calls.append(("bwd", tuple(lefts), right))
        self.count += len(lefts)
        return [self.fn(c, right) for c in lefts]


def grid_ids(B: int, K: int) -> list[list[int]]:
    """Candidate ids that encode their position: 100*i + j (so recorded calls say which slot was scored)."""
    return [[100 * i + j for j in range(K)] for i in range(B)]


class Recorder:
    """Wraps a proposer and records the verified part of every proposal."""

    def __init__(self, inner):
        self.inner, self.taps, self.max_width, self.drafts = inner, inner.taps, inner.max_width, []

    def begin(self, prompt, hidden):
        self.inner.begin(prompt, hidden)

    def propose(self, prefix, k):
        prop = self.inner.propose(prefix, k)
        self.drafts.append(list(prop.ids[:k]))
        return prop

    def observe(self, hidden):
        self.inner.observe(hidden)


def assert_near(got, want, atol: float, why: str, rtol: float = 0.0) -> float:
    """Tensors of two kernel paths (static vs growing cache, block vs one-token, batched vs alone) agree within a
    stated tolerance; returns the worst |difference|.

    Why not bit equality: the two paths feed different shapes and masks to the matmuls, so their float sums may
    round differently on another CPU kind (AVX2 vs AVX-512 vector widths, oneDNN/MKL blocking) even where they
    happen to agree on this one. The margin (worst difference against the tolerance) is printed, so `pytest -rP`
    shows how close each such test runs to its bound; `why` says what the tolerance is sized from."""
    import torch

    diff = (got.double() - want.double()).abs()
    worst = float(diff.max()) if diff.numel() else 0.0
    bound = atol + rtol * float(want.double().abs().max()) if want.numel() else atol
    print(f"tolerance margin [{why}]: worst |diff| {worst:.3g} against {bound:.3g}"
          f" ({'exact' if worst == 0 else f'{bound / worst:.0f}x headroom'})")
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    return worst


def assert_topk_near(ids_a, vals_a, ids_b, vals_b, atol: float, why: str) -> None:
    """Top-k of two kernel paths: the values within `atol`, the ids equal except where two neighbouring ranks tie
    within the tolerance (a near-tie may swap order between kernel paths; a real difference may not)."""
    import torch

    assert_near(vals_a, vals_b, atol, why)
    differ = ids_a != ids_b
    if bool(differ.any()):
        gaps = (vals_a[..., :-1] - vals_a[..., 1:]).abs() <= 2 * atol  # rank r ties rank r+1
        tied = torch.zeros_like(differ)
        tied[..., :-1] |= gaps
        tied[..., 1:] |= gaps
        assert bool(tied[differ].all()), f"top-k ids differ beyond a near-tie ({why})"


def check_method_property(rt, prep, method: str, data) -> None:
    """The one method property (tests/runtime/test_exactness.py on the CPU, tests/runtime/test_gpu.py on CUDA):
    `method` with drawn options, prompt, budget and width decodes exactly greedy's ids (float64, strict), with sound
    stats."""
    B = prep.drafter.cfg.block_size
    prompt = data.draw(prompts(rt.vocab_size, max_len=32), label="prompt")
    budget = data.draw(st.integers(0, 32), label="budget")
    width = data.draw(st.integers(1, B), label="width")
    opts = data.draw(method_options(method), label="options")
    got, stats = speculative(rt, get_method(method).build(rt, prep, **opts), list(prompt), budget, width,
                             method=method)
    assert got == list(reference(rt, prompt)[0][:budget])
    check_invariants(stats, width, budget)
    assert stats.guidance_work >= 0 and all(isinstance(v, (int, float)) for v in stats.meta.values())
    if method == "act" and stats.draft_calls:
        assert stats.meta["act_verified"] == stats.proposed
        assert stats.meta["act_verified"] + stats.meta["act_trimmed"] == stats.meta["act_margin_rows"]


def alarm(seconds: int):
    """A context manager: fail (instead of hanging the suite) when the body blocks longer than `seconds`."""
    import signal
    from contextlib import contextmanager

    @contextmanager
    def armed():
        def fire(signum, frame):
            raise TimeoutError(f"blocked for {seconds}s")

        old = signal.signal(signal.SIGALRM, fire)
        signal.alarm(seconds)
        try:
            yield
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)
    return armed()
