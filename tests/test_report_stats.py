"""Which differences a run resolves: bootstrap intervals, rank groups and the A/A noise gate, proved on
injected rounds of known noise (and a fake clock for the gate's own measurement)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dflash_core.bench.stats import aa_noise, bootstrap_ci, leading_width, rank_groups
from dflash_core.report.build import build_report
from dflash_core.report.html import render_index, render_report
from dflash_core.report.plugin import noise_warning

from .report_data import bench_row, known_rounds, saved_run, with_noise


def test_ci_covers_the_true_speedup_and_excludes_values_beyond_the_noise():
    lo, hi = bootstrap_ci(known_rounds(1.5, 0.02))
    assert lo < 1.5 < hi
    assert hi < 1.52 and lo > 1.48  # 24 rounds of sd 0.02: the median is known to about +-0.01
    assert bootstrap_ci(known_rounds(1.5, 0.02)) == (lo, hi)  # seeded: a rebuilt report shows the same interval


def test_ci_widens_with_the_noise_and_is_a_point_for_one_round():
    quiet = bootstrap_ci(known_rounds(1.5, 0.01, seed=1))
    noisy = bootstrap_ci(known_rounds(1.5, 0.2, seed=1))
    assert noisy[1] - noisy[0] > 5 * (quiet[1] - quiet[0])
    assert noisy[0] < 1.5 < noisy[1]
    assert bootstrap_ci([1.3]) == (1.3, 1.3)


def test_the_leaders_group_holds_what_overlaps_the_leader_and_the_rest_is_one_group():
    cases = {"a": (2.0, (1.9, 2.1)), "b": (1.95, (1.85, 2.05)), "c": (1.8, (1.7, 1.88)), "d": (1.0, (0.9, 1.1))}
    # b overlaps the leader a; c overlaps b but not a, so it is resolved below the leader's group, with d
    assert rank_groups(cases) == [["a", "b"], ["c", "d"]]
    assert rank_groups({k: cases[k] for k in "ab"}) == [["a", "b"]]  # no empty second group
    assert rank_groups({}) == []


def test_the_resolution_is_measured_from_the_leader_not_from_a_neighbour():
    tight = {"a": (1.04, (1.039, 1.041)), "b": (1.03, (1.029, 1.031)), "c": (0.99, (0.989, 0.991))}
    assert rank_groups(tight) == [["a"], ["b", "c"]]  # intervals alone separate all three from a
    # a is 0.97 % above b, 5.1 % above c: a 3 % resolution joins b to the leader and keeps c out
    assert rank_groups(tight, 0.03) == [["a", "b"], ["c"]]
    assert rank_groups(tight, 0.06) == [["a", "b", "c"]]
    # steps of 2 % each within a 3 % resolution, but c and d are 4 % and 6 % below the leader: no chaining
    steps = {k: (v, (v - 0.001, v + 0.001)) for k, v in {"a": 1.06, "b": 1.04, "c": 1.02, "d": 1.00}.items()}
    assert rank_groups(steps, 0.03) == [["a", "b"], ["c", "d"]]
    with pytest.raises(ValueError, match="resolution"):
        rank_groups(tight, -0.01)


def test_the_leading_width_is_the_highest_speedup_ties_to_the_smaller_width():
    assert leading_width([(2.1, 4), (2.3, 8), (2.2, 2)]) == 8
    assert leading_width([(2.3, 8), (2.3, 4), (1.0, 2)]) == 4
    assert leading_width(x for x in []) is None


def _continuum_run(seed: int, act: float = 1.0) -> dict:
    """Two clear leaders 9-10 % above a continuum of eight methods 0.5 % apart, a method (`act`) that moves with
    the machine's state, and a clear last, each with 12 rounds of 1 % noise: the shape of the lab's 2-core CPU
    runs (docs/performance.md §11-12)."""
    truth = {"top1": 1.10, "top2": 1.09, **{f"mid{i}": 1.00 - 0.005 * i for i in range(8)}, "act": act, "last": 0.90}
    rounds = {k: known_rounds(v, 0.01, n=12, seed=seed * 100 + i) for i, (k, v) in enumerate(truth.items())}
    return {k: (float(np.median(v)), bootstrap_ci(v)) for k, v in rounds.items()}


def test_noisy_runs_in_either_machine_state_give_the_same_groups():
    """Seeds are runs; act at 0.99 or 1.04 is the two states of session 7 (calibration follows the verify-cost
    curve). A partition of the continuum (chains, or "repeat on the rest") would cut it, or bridge it to the
    leaders through act, differently from run to run; the leader's group does not move."""
    want = [["top1", "top2"], sorted(["act", "last", *(f"mid{i}" for i in range(8))])]
    for seed in (1, 2, 3):
        for act in (0.99, 1.04):
            got = rank_groups(_continuum_run(seed, act), 0.02)  # the default --bench-resolution
            assert [sorted(g) for g in got] == want, (seed, act)


def _run(rounds_by_method: dict[str, list[float]], noise=None) -> dict:
    rows = [bench_row("normal", 0, rounds=[1.0, 1.0, 1.0])]
    for mid, rounds in rounds_by_method.items():
        rows.append(bench_row(mid, 2, speedup=sorted(rounds)[len(rounds) // 2], rounds=rounds))
    saved = saved_run(rows)
    return with_noise(saved, *noise) if noise else saved


def test_overlapping_methods_share_a_group_and_no_single_winner_is_named():
    doc = build_report([_run({"dflash": known_rounds(1.50, 0.05, seed=2), "act": known_rounds(1.51, 0.05, seed=3),
                              "mobs": known_rounds(1.20, 0.05, seed=4)})], ["r"])
    assert doc["rank_groups"][0] == sorted(["dflash", "act"], key=lambda m: -doc["methods"][m]["best"]["speedup"])
    assert doc["rank_groups"][1:] == [["mobs"]]
    assert doc["winner"] is None and doc["leader"]["method"] in ("dflash", "act")
    assert doc["methods"]["mobs"]["best"]["rank_group"] == 2 and doc["methods"]["act"]["best"]["rank_group"] == 1
    assert "2 methods this run cannot tell apart" in render_report(doc)  # the rank-group KPI, no single name
    for page in (render_report(doc), render_index(doc)):
        table = page.split("id=methods-table", 1)[1].split("</table>", 1)[0]
        assert table.count("<td class=group>G1</td>") == 2 and table.count("<td class=group>G2</td>") == 1


def test_separated_methods_split_and_the_leader_alone_is_the_winner():
    doc = build_report([_run({"dflash": known_rounds(1.9, 0.02, seed=5), "act": known_rounds(1.5, 0.02, seed=6)})],
                       ["r"])
    assert doc["rank_groups"] == [["dflash"], ["act"]]
    assert doc["winner"]["method"] == "dflash" and doc["winner"]["rank_group"] == 1
    page = render_report(doc)
    assert "the only method in G1" in page and "methods this run cannot tell apart" not in page


QUIET = (known_rounds(1.0, 0.005, n=3, seed=7), known_rounds(1.0, 0.005, n=3, seed=8))
NOISY = ([1.0, 0.85, 1.12], [0.97, 1.18, 1.02])


@pytest.mark.parametrize("noise, threshold, banner", [(QUIET, 0.05, False), (NOISY, 0.05, True),
                                                      (NOISY, 0.25, False)])
def test_aa_banner_appears_only_above_the_threshold(noise, threshold, banner):
    doc = build_report([_run({"dflash": [1.5, 1.6, 1.7]}, noise=(*noise, threshold))], ["r"])
    n = doc["noise"]
    assert n["rounds"] == [*noise[0], *noise[1]] and n["threshold"] == threshold
    assert n["spread"] == pytest.approx(max(abs(x - 1) for x in n["rounds"]))
    assert n["noisy"] is banner
    for page in (render_report(doc), render_index(doc)):
        assert ("id=noise-banner" in page) is banner
        assert f"{100 * n['spread']:.1f} %" in page.split("</header>", 1)[0]  # the A/A spread is in the header
    warning = noise_warning({"noise": {"start": noise[0], "end": noise[1], "threshold": threshold}})
    assert (warning is not None) is banner


def test_a_run_without_aa_rounds_has_no_banner_and_says_so():
    doc = build_report([saved_run([bench_row("normal", 0), bench_row("dflash", 2, speedup=1.5)])], ["r"])
    assert doc["noise"]["spread"] is None and doc["noise"]["noisy"] is False
    page = render_report(doc)
    assert "id=noise-banner" not in page and "A/A spread: not measured" in page


def test_aa_noise_spread_is_the_largest_departure_from_one():
    assert aa_noise([1.02, 0.9, 1.04], 0.05)["spread"] == pytest.approx(0.1)
    assert aa_noise([1.02, 0.99], 0.05)["noisy"] is False


def test_measure_aa_times_normal_against_normal_with_the_case_pairing(monkeypatch):
    """A fake clock: every normal wall is 1 s, every timed one 1/(1+e) s, so round i's ratio must be 1+e_i."""
    from dflash_core.bench import rounds as bench

    eps = [0.0, 0.1, -0.05]
    walls = iter([1.0] + [w for e in eps for w in (1.0, 1.0 / (1 + e))])  # warm-up, then (normal, timed) pairs
    calls = []

    def fake_decode_all(sess, method, width, trace=None):
        calls.append(method)
        return [], [], next(walls)

    monkeypatch.setattr(bench, "decode_all", fake_decode_all)
    sess = SimpleNamespace(cfg=SimpleNamespace(rounds=3, threads=1, tokens=8), rt=SimpleNamespace(device=None),
                           aa_rounds={})
    rounds = bench.measure_aa(sess, "end")
    assert rounds == pytest.approx([1 + e for e in eps]) and sess.aa_rounds == {"end": rounds}
    assert calls == ["normal"] * 7


def test_groups_compare_each_method_with_dflash_in_the_same_rounds():
    """Schema 5: with `vs_baseline_rounds` on every row, the rank groups come from the ratio against plain dflash
    timed in the same rounds, at the leading width. A machine that switches between a slow and a fast state
    makes every speedup over greedy bimodal (their intervals all overlap), while the per-round ratio still
    separates a method that is steadily 10 % slower than dflash and keeps one that equals it in G1."""
    modes = [2.3, 2.8, 2.3, 2.8, 2.3, 2.8, 2.3, 2.8]
    vs = {"dflash": known_rounds(1.0, 0.01, n=8, seed=11), "act": known_rounds(1.0, 0.01, n=8, seed=12),
          "mobs": known_rounds(0.9, 0.01, n=8, seed=13)}
    rows = [bench_row("normal", 0, rounds=[1.0, 1.0, 1.0])]
    for mid, q in vs.items():
        sp = [m * x for m, x in zip(modes, q)]
        row = bench_row(mid, 2, speedup=sorted(sp)[4], rounds=sp)
        row["extra_info"].update(vs_baseline_rounds=q, vs_baseline=sorted(q)[4], baseline="dflash")
        rows.append(row)
    doc = build_report([saved_run(rows)], ["r"])
    assert doc["ranking"] == {"statistic": "vs_baseline", "width": 2, "baseline": "dflash", "resolution": 0.02,
                              "rule": "leader-group"}
    assert sorted(doc["rank_groups"][0]) == ["act", "dflash"] and doc["rank_groups"][1:] == [["mobs"]]
    assert doc["methods"]["mobs"]["best"]["vs_baseline_ci"][1] < 0.95
    # the same rounds without the comparison leg: ranked by speedup over greedy, the bimodal intervals overlap
    for r in rows:
        for k in ("vs_baseline_rounds", "vs_baseline", "baseline"):
            r["extra_info"].pop(k, None)
    old = build_report([saved_run(rows)], ["r"])
    assert old["ranking"]["statistic"] == "speedup" and len(old["rank_groups"]) == 1
    assert "<td class=vs>" in render_report(doc) and "against plain dflash" in render_report(doc)
