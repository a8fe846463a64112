"""The `tuned` linear path (runtime/layouts.py): the layout choice against timing models whose truth is known, the
per-call dispatch, the products, and exactness of decoding on the path."""

from __future__ import annotations

import random

import pytest

from dflash_core.testing import TinySpec, build_tiny

from ..support.helpers import check_path_exactness

VOCAB = TinySpec().vocab_size


def _cands():
    import torch

    return ("nt", "nn", "onednn") if torch.backends.mkldnn.is_available() else ("nt", "nn")


def test_choose_keeps_the_loaded_layout_unless_another_is_faster_by_the_margin():
    from dflash_core.runtime.layouts import choose

    ms = {"nt": (10.0, 10.0, 10.0, 10.0), "nn": (9.6, 9.4, 5.0, 11.0), "onednn": (20.0, 20.0, 4.0, 10.4)}
    table = choose(ms, (1, 2, 5, 9), margin=0.05)
    # 9.6 is only 4 % under nt: nt stays; 9.4 is 6 % under: nn; 4.0 beats 5.0: oneDNN; nothing under 10 at 9 rows
    assert table.choice == ("nt", "nn", "onednn", "nt")
    assert [table.layout(n) for n in (1, 2, 3, 4, 5, 8, 9, 500)] == ["nt", "nn", "nn", "nn", "onednn", "onednn",
                                                                       "nt", "nt"]
    assert table.used() == {"nt", "nn", "onednn"}
    with pytest.raises(ValueError, match="nt"):
        choose({"nn": (1.0,)}, (1,))


TRUTH = {"nt": lambda n: 50.0 + 12.0 * n, "nn": lambda n: 68.0 + 3.0 * n, "onednn": lambda n: 130.0 + 4.0 * n}


@pytest.mark.parametrize("seed", range(5))
def test_the_probe_recovers_the_layouts_of_a_known_timing_model(seed):
    """A timing model with a crossover (nt 12 % cheaper at 1 row, nn 7 % cheaper at 2 rows and far cheaper after;
    oneDNN never), 3 % multiplicative noise: the table the probe builds is the true one at every probed count."""
    from dflash_core.runtime.layouts import PROBE_ROWS, probe

    rng = random.Random(seed)

    def run(candidate, n):
        return TRUTH[candidate](n) * (1 + rng.gauss(0, 0.03)) / 1000.0

    table = probe(None, run=run)
    want = []
    for n in PROBE_ROWS:
        t = {c: TRUTH[c](n) for c in _cands()}
        best = min(t, key=t.get)
        want.append(best if t[best] < 0.95 * t["nt"] else "nt")
    assert table.choice == tuple(want) and want[0] == "nt" and want[-1] == "nn"


def test_the_probe_does_not_mistake_a_machine_speeding_up_for_a_faster_layout():
    """Every layout costs the same, but each pass runs 4 % faster than the one before (a CPU leaving a frequency
    dip, a neighbour going idle). Rotating the candidates' order every repetition puts the drift on all of them
    alike, so the loaded layout stays everywhere; run in a fixed order, the last candidate looked ~8 % faster."""
    from dflash_core.runtime.layouts import PROBE_ROWS, probe

    calls = [0]

    def run(candidate, n):
        calls[0] += 1
        return 0.96 ** calls[0] * (1.0 + 0.01 * n)

    table = probe(None, run=run)
    assert table.choice == ("nt",) * len(PROBE_ROWS), table.to_dict()


def test_a_tuned_linear_runs_the_layout_its_table_names_for_the_rows_of_the_call():
    import torch
    from torch import nn

    from dflash_core.runtime.layouts import LayoutTable, TunedLinear

    torch.manual_seed(0)
    lin = nn.Linear(8, 5, bias=True)
    table = LayoutTable((1, 3, 9), ("nt", "nn", "onednn"), {})
    tl = TunedLinear(lin, table, {}) if torch.backends.mkldnn.is_available() else None
    if tl is None:
        table = LayoutTable((1, 3), ("nt", "nn"), {})
        tl = TunedLinear(lin, table, {})
    tl.weight_t = torch.zeros_like(tl.weight_t)  # mark the layouts: nn now gives the bias alone, oneDNN ones
    tl.packed = {"onednn": lambda x: torch.ones(*x.shape[:-1], 5)}
    for shape in ((1, 8), (2, 8), (3, 8), (1, 8, 8), (2, 4, 8), (9, 8), (3, 5, 8), (70, 8)):
        x = torch.randn(*shape)
        rows = x.numel() // 8
        got = tl(x)
        layout = "nt" if rows < 3 else "nn" if rows < 9 or len(table.rows) == 2 else "onednn"  # the table by hand
        want = {"nt": torch.nn.functional.linear(x, lin.weight, lin.bias),
                "nn": lin.bias.expand(*shape[:-1], 5), "onednn": torch.ones(*shape[:-1], 5)}[layout]
        assert got.shape == (*shape[:-1], 5) and torch.equal(got, want), (shape, layout)


def test_every_layout_computes_the_linear_product():
    import torch
    from torch import nn

    from dflash_core.runtime.layouts import LayoutTable, TunedLinear

    torch.manual_seed(1)
    for bias in (True, False):
        lin = nn.Linear(48, 40, bias=bias)
        for layout in _cands():
            tl = TunedLinear(lin, LayoutTable((1,), (layout,), {}), {})
            for shape in ((1, 48), (5, 48), (2, 7, 48)):
                x = torch.randn(*shape)
                torch.testing.assert_close(tl(x), lin(x), rtol=1e-5, atol=1e-5)


def test_a_tied_weight_gets_one_copy_per_layout_and_the_model_keeps_its_parameters():
    import torch

    from dflash_core.runtime.layouts import LayoutTable, TunedLinear, apply_tuned

    model = build_tiny(TinySpec(pattern="CACA", dtype="float32", seed=2))
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.get_input_embeddings().weight
    names = sorted(n for n, _ in model.named_parameters())
    apply_tuned(model, LayoutTable((1, 2), ("nt", "nn"), {}))
    assert sorted(n for n, _ in model.named_parameters()) == names
    assert isinstance(model.lm_head, TunedLinear)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    copies = {id(m.weight_t) for m in model.modules() if isinstance(m, TunedLinear)}
    linears = {id(m.weight) for m in model.modules() if isinstance(m, TunedLinear)}
    assert len(copies) == len(linears)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())


def test_the_path_keeps_the_probes_copies_of_the_weights_instead_of_copying_them_again():
    from dflash_core.runtime.layouts import LayoutTable, TunedLinear, apply_tuned, distinct_linears, probe

    model = build_tiny(TinySpec(pattern="CACA", dtype="float32", seed=4))
    copies: dict = {}
    probe(model, rows=(1, 2), reps=1, copies=copies)
    assert {("nn", id(lin.weight)) for lin in distinct_linears(model)} <= set(copies)
    apply_tuned(model, LayoutTable((1, 2), ("nt", "nn"), {}), copies)
    tuned = [m for m in model.modules() if isinstance(m, TunedLinear)]
    assert tuned and all(m.weight_t is copies[("nn", id(m.weight))] for m in tuned)


def test_a_table_that_never_leaves_the_loaded_layout_makes_no_copies():
    from dflash_core.runtime.layouts import LayoutTable, TunedLinear, apply_tuned

    model = apply_tuned(build_tiny(TinySpec(pattern="CACA", dtype="float32")), LayoutTable((1, 9), ("nt", "nt"), {}))
    assert all(m.weight_t is None and not m.packed for m in model.modules() if isinstance(m, TunedLinear))


@pytest.mark.exactness
def test_the_tuned_path_is_exact_in_every_layout_and_keeps_the_artifact_identity(tmp_path):
    """`--kernels tuned` as `load_target` builds it (probe recorded in the target's info), and with a table forcing
    each layout on some row counts: speculative == greedy on the path, greedy == eager greedy up to certified ties,
    the target identity unchanged."""
    from dflash_core.runtime.kernels import apply_kernels
    from dflash_core.runtime.layouts import LayoutTable
    from dflash_core.runtime.target import load_target
    from dflash_core.store.artifacts import target_identity

    build_tiny(TinySpec(pattern="CCACAC", dtype="float32", seed=3)).save_pretrained(tmp_path)
    eager = load_target(str(tmp_path), "cpu", "float32", kernels="eager")
    tuned = load_target(str(tmp_path), "cpu", "float32", kernels="tuned")
    info = tuned.info["kernel_layouts"]
    assert tuned.kernels == "tuned" and len(info["rows"]) == len(info["choice"]) and info["rows"][0] == 1
    assert set(info["choice"]) <= set(_cands()) and set(info["ms_per_pass"]) == set(_cands())
    assert target_identity(tuned) == target_identity(eager)
    forced = load_target(str(tmp_path), "cpu", "float32", kernels="eager")
    apply_kernels(forced.model, "tuned", table=LayoutTable((1, 2, 4), ("nt", "nn", _cands()[-1]), {}))
    for rt in (tuned, forced):
        check_path_exactness(rt, eager, VOCAB)
    with pytest.raises(Exception, match="CPU float32"):
        apply_kernels(build_tiny(TinySpec(dtype="float64")), "tuned")


def test_the_report_names_the_path_and_its_layouts_and_shows_a_malformed_table_as_the_path_alone():
    from dflash_core.report.html import kernels_note

    rows = [1, 2, 3, 5, 9, 17, 64]
    assert kernels_note({"kernels": "tuned", "kernel_layouts": {"rows": rows, "choice": ["nt"] + ["nn"] * 6}}) == \
        "tuned (nt at 1 row, nn at 2+ rows)"
    assert kernels_note({"kernels": "tuned", "kernel_layouts": {
        "rows": rows, "choice": ["nt", "nt", "nt", "nn", "nn", "onednn", "nn"]}}) == \
        "tuned (nt at 1-4 rows, nn at 5-16 rows, onednn at 17-63 rows, nn at 64+ rows)"
    assert kernels_note({}) == "eager"
    for bad in ({"rows": [1, "2"], "choice": ["nt", "nn"]}, {"rows": [1], "choice": ["nt", "nn"]}, [1, 2],
                {"rows": [True], "choice": ["nt"]}, {"rows": [], "choice": []}):
        assert kernels_note({"kernels": "tuned", "kernel_layouts": bad}) == "tuned"
