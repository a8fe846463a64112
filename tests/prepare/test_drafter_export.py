"""The drafter in transformers' DFlash format: export, load, cross-check against transformers' own drafter,
import with `--drafter` (all methods run on it), and refusal of a drafter made for another target."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dflash_core import __main__ as cli
from dflash_core.errors import ArtifactError, BadInputError
from dflash_core.methods import METHODS, method_ids
from dflash_core.methods.runner import run_method
from dflash_core.prepare.drafter_format import load_hf_drafter
from dflash_core.prepare.pipeline import prepare
from dflash_core.prepare.prepared import load_prepared
from dflash_core.runtime.drafter import DraftState
from dflash_core.runtime.exactness import TIE_TOLERANCE
from dflash_core.runtime.target import load_target
from dflash_core.testing import tiny_prepare_config

from ..support.helpers import reference

PROMPTS = ([5, 9, 17, 33, 42, 7], [3, 4, 5, 6, 7, 8, 9, 10, 11], [60, 2, 60, 2, 60], [12, 80, 31])


@pytest.fixture(scope="module")
def exported(tiny_prepared, tmp_path_factory):
    """The tiny prepared drafter written by the `export-drafter` command."""
    out = tmp_path_factory.mktemp("export") / "drafter"
    rc = cli.main(["export-drafter", "--target", str(tiny_prepared.path), "--home", str(tiny_prepared.home),
                   "--out", str(out)])
    assert rc == 0
    return out


def _hf(path, dtype):
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(path), dtype=dtype).eval()


def _blocks(rt, drafter, hf, prompt):
    """(ours, transformers') drafted ids and our logits for the block anchored at prompt[-1], context prompt[:-1]."""
    taps = rt.session(recording=False).prefill(prompt, taps=drafter.cfg.taps).hidden
    embed, head = rt.model.get_input_embeddings(), rt.model.get_output_embeddings()
    st = DraftState(drafter)
    st.extend(taps[:-1])
    ours, _ = st.draft(prompt[-1], embed, head)
    n = len(prompt) - 1
    ids = torch.tensor([[prompt[-1]] + [hf.config.mask_token_id] * (hf.config.block_size - 1)])
    with torch.inference_mode():
        out = hf(noise_embeds=embed(ids), context_hidden_states=taps[:-1].unsqueeze(0).to(hf.dtype),
                 position_ids=torch.arange(n + hf.config.block_size).unsqueeze(0))
        theirs = head(out.last_hidden_state[0, 1:].to(head.weight.dtype))
    return ours.argmax(-1).tolist(), theirs.argmax(-1).tolist(), ours


def test_export_is_a_transformers_dflash_checkpoint(tiny_prepared, exported):
    from safetensors import safe_open

    assert sorted(p.name for p in exported.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    cfg = tiny_prepared.prepared.drafter.cfg
    hf = _hf(exported, torch.float32)
    assert type(hf).__name__ == "MuseGlimmerAssistantModel"
    assert hf.config.block_size == cfg.block_size + 1  # transformers counts the anchor row
    assert list(hf.config.target_layer_ids) == list(cfg.taps)
    assert hf.config.mask_token_id == cfg.mask_token_id == (tiny_prepared.rt.config.pad_token_id or 0)
    with safe_open(str(exported / "model.safetensors"), framework="pt") as f:
        assert {k for k in f.keys() if "encoder" in k} == {"encoder.fc.weight", "encoder.output_norm_enc.weight"}
    # the round trip back into our drafter keeps every weight bit for bit
    back = load_hf_drafter(exported, tiny_prepared.rt)
    ours = tiny_prepared.prepared.drafter.state_dict()
    assert back.cfg == cfg
    for k, v in back.state_dict().items():
        assert torch.equal(v, ours[k].float()), k


def _card(directory):
    """(front matter as parsed YAML, body) of an exported drafter's README.md."""
    import yaml

    text = (directory / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    head, body = text[4:].split("\n---\n", 1)
    return yaml.safe_load(head), body


def test_model_card_metadata_parses_and_its_figures_match_the_manifest(tiny_prepared, exported):
    """The hub's YAML front matter parses; every figure in the card is the home's manifest's; tau is "not measured"
    when no benchmark report of this drafter exists; the card shows the transformers call and the lab's --drafter."""
    import re

    meta, body = _card(exported)
    assert meta["library_name"] == "transformers" and meta["license"] == "mit"
    assert "base_model" not in meta and "pipeline_tag" not in meta  # a local target has no hub id to link
    assert {"dflash", "speculative-decoding"} <= set(meta["tags"])
    man = tiny_prepared.prepared.manifest
    ident = man["target"]
    for key in ("content_sha256", "weights_sha256", "tokenizer_sha256"):
        assert f"`{ident[key]}`" in body, key
    held = man["drafter"]["heldout_position_accuracy"]
    rows = re.findall(r"^\| (\d+) \| ([0-9.]+) \| ([0-9.]+) \|$", body, re.M)
    assert [int(r[0]) for r in rows] == list(range(1, len(held) + 1))
    assert [float(r[1]) for r in rows] == [round(a, 3) for a in held]
    assert [float(r[2]) for r in rows] == [round(a, 3) for a in man["drafter"]["train_position_accuracy"]]
    t = man["teacher"]
    assert f"**{t['sequences']} sequences, {t['tokens']} tokens**" in body
    assert f"{man['drafter']['heldout_sequences']} held-out" in body
    assert "Tokens per target call (τ) on the lab's benchmark prompts: **not measured**" in body
    assert 'assistant_model=drafter, speculation_type="dflash", do_sample=False' in body
    assert "--drafter /path/to/this/directory" in body


def _bench_report(tmp_path, man: dict, device: str, drafter_sha: str, speedup: float) -> Path:
    """A benchmark.json as `report` writes it, of the drafter `drafter_sha` on the manifest's target (the export
    validates it: report.schema.check_benchmark)."""
    from dflash_core.report.__main__ import main as report_main

    from ..support.report_data import bench_row, saved_run

    run = saved_run([bench_row("normal", 0, device=device), bench_row("dflash", 2, device=device, speedup=speedup,
                                                                      tau=speedup)])
    run["commit_info"]["id"] = "0123456789abcdef"
    run["datetime"] = "2026-12-01T00:00:00"
    run["dflash"]["settings"].update(prompt_limit=4, tokens=48)
    run["dflash"]["target"]["content_sha256"] = man["target"]["content_sha256"]
    run["dflash"]["provenance"]["artifacts"]["files"] = {"drafter.safetensors": {"sha256": drafter_sha}}
    saved = tmp_path / f"{device}.json"
    saved.write_text(json.dumps(run))
    assert report_main([str(saved), "--out", str(tmp_path / "reports")]) == 0
    return tmp_path / "reports" / device / "benchmark.json"


def test_model_card_takes_tau_from_a_benchmark_report_of_this_drafter(tiny_prepared, tmp_path, monkeypatch):
    """A report that measured this drafter (same drafter.safetensors SHA-256, same target) gives the card its tau;
    a report of another drafter does not."""
    man = tiny_prepared.prepared.manifest
    sha = man["files"]["drafter.safetensors"]["sha256"]

    def report(device, drafter_sha, speedup):
        _bench_report(tmp_path, man, device, drafter_sha, speedup)

    report("cpu", sha, 2.25)
    report("cuda", "0" * 64, 9.99)  # another drafter's report
    monkeypatch.setenv("DFLASH_REPORTS", str(tmp_path / "reports"))
    out = tmp_path / "drafter"
    assert cli.main(["export-drafter", "--target", str(tiny_prepared.path), "--home", str(tiny_prepared.home),
                     "--out", str(out)]) == 0
    _, body = _card(out)
    assert "| 2 | 2.25 |" in body and "9.99" not in body and "not measured" not in body.split("## Tokens", 1)[1]
    assert "4 held-out benchmark prompts x 48 tokens" in body and "`0123456789ab`" in body


@pytest.mark.parametrize("edit", [lambda d: d["methods"]["dflash"].update(rows="2.25"),
                                  lambda d: d.update(settings=[4, 48]), lambda d: d.update(runs="x"),
                                  lambda d: d.update(device="cpu\n# <img src=x onerror=alert(1)>")],
                         ids=["rows-string", "settings-list", "runs-string", "device-markup"])
def test_export_refuses_a_malformed_report_of_its_drafter(tiny_prepared, tmp_path, monkeypatch, capsys, edit):
    """Issue 70: a malformed benchmark.json of the same drafter crashed export-drafter, and its device string went
    raw into the card's markdown. It is validated by the report's loader: one error line naming the file, exit 2,
    and no card written."""
    man = tiny_prepared.prepared.manifest
    path = _bench_report(tmp_path, man, "cpu", man["files"]["drafter.safetensors"]["sha256"], 2.25)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("DFLASH_REPORTS", str(tmp_path / "reports"))
    capsys.readouterr()
    out = tmp_path / "drafter"
    assert cli.main(["export-drafter", "--target", str(tiny_prepared.path), "--home", str(tiny_prepared.home),
                     "--out", str(out)]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and str(path) in err[0], err
    assert not (out / "README.md").exists()


def test_model_card_transformers_snippet_runs(tiny_prepared, exported, monkeypatch, capsys):
    """The card's Python block, pointed at the tiny target and the exported drafter, runs as written (the tiny
    target has no tokenizer: a stand-in gives it prompt ids) and prints the decoded continuation."""
    from types import SimpleNamespace

    import transformers

    _, body = _card(exported)
    code = body.split("```python\n", 1)[1].split("```", 1)[0]
    code = code.replace('"/path/to/the/target"', repr(str(tiny_prepared.path)))
    code = code.replace('"/path/to/this/directory"', repr(str(exported)))

    class Tokenizer:
        def __call__(self, text, return_tensors):
            return SimpleNamespace(input_ids=torch.tensor([list(PROMPTS[0])]))

        def decode(self, ids):
            return "ids " + " ".join(map(str, ids.tolist()))

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Tokenizer())
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.split()
    assert printed[0] == "ids" and len(printed) > 8


def test_model_card_of_a_hub_target_links_its_base_model():
    import yaml

    from dflash_core.prepare.model_card import _yaml, front_matter

    meta = yaml.safe_load(_yaml(front_matter({"name": "LiquidAI/LFM2.5-350M-Base"}, "hub")).strip("-\n"))
    assert meta["base_model"] == "LiquidAI/LFM2.5-350M-Base" and meta["license"] == "other"
    assert meta["library_name"] == "transformers"


def test_same_block_as_transformers_drafter_float64(tiny_prepared, exported):
    """Two independent implementations, same weights and context: the same drafted ids, strictly, in float64."""
    rt, drafter = tiny_prepared.rt, tiny_prepared.prepared.drafter
    hf = _hf(exported, torch.float64)
    for p in PROMPTS:
        ctx = list(p) + list(reference(rt, tuple(p))[0][:10])
        for cut in range(2, len(ctx) + 1, 3):
            ours, theirs, _ = _blocks(rt, drafter, hf, ctx[:cut])
            assert ours == theirs, (ctx[:cut], ours, theirs)


def test_same_block_as_transformers_drafter_float32(tiny_prepared, exported):
    """float32: equal ids, or a difference only where our own top1-top2 gap is inside the tie tolerance."""
    rt = load_target(str(tiny_prepared.path), "cpu", "float32")
    prepared = load_prepared(rt, home=tiny_prepared.home)
    hf = _hf(exported, torch.float32)
    compared = 0
    for p in PROMPTS:
        ctx = list(p) + list(reference(tiny_prepared.rt, tuple(p))[0][:10])
        for cut in range(2, len(ctx) + 1, 3):
            ours, theirs, logits = _blocks(rt, prepared.drafter, hf, ctx[:cut])
            for i, (a, b) in enumerate(zip(ours, theirs)):
                compared += 1
                if a != b:
                    gap = float(logits[i].topk(2).values.diff().abs())
                    assert gap < TIE_TOLERANCE["float32"], (ctx[:cut], i, a, b, gap)
    assert compared > 50


def test_transformers_dflash_generation_drafts_our_blocks(tiny_prepared, exported, monkeypatch):
    """Inside transformers' own DFlash generate loop, every block it drafts is the block our drafter drafts at
    that context, and its output is greedy's (float64, strict). transformers runs its logits processors over the
    drafts too (min_new_tokens forbids EOS before the 16th new token), so our block is compared with EOS forbidden
    in the same slots."""
    from transformers.generation import candidate_generator as cg

    rt, drafter = tiny_prepared.rt, tiny_prepared.prepared.drafter
    hf = _hf(exported, torch.float64)
    seen = []
    original = cg.DFlashTokenCandidateGenerator.get_candidates

    def recording(self, input_ids, *a, **k):
        ids, logits = original(self, input_ids, *a, **k)
        if logits is not None:
            seen.append((prompt_len[0], input_ids[0].tolist(), ids[0, input_ids.shape[1]:].tolist()))
        return ids, logits

    monkeypatch.setattr(cg.DFlashTokenCandidateGenerator, "get_candidates", recording)
    prompt_len = [0]
    for p in PROMPTS[:2]:
        prompt_len[0] = len(p)
        with torch.inference_mode():
            g = rt.model.generate(torch.tensor([p]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                                  pad_token_id=0, assistant_model=hf, speculation_type="dflash")
        assert g[0, len(p):].tolist() == list(reference(rt, tuple(p))[0][:16])
    assert len(seen) >= 4
    eos = rt.config.eos_token_id
    for n_prompt, ctx, drafted in seen:
        logits = _blocks(rt, drafter, hf, ctx)[2].clone()
        for i in range(len(logits)):
            if len(ctx) + i - n_prompt < 16:  # transformers' MinNewTokensLengthLogitsProcessor, per drafted slot
                logits[i, eos] = float("-inf")
        ours = logits.argmax(-1).tolist()
        assert drafted == ours[: len(drafted)], (ctx, drafted, ours)


def test_reference_row_is_exact(tiny_prepared):
    from dflash_core.bench.peers import reference_runner

    rt = tiny_prepared.rt
    prompts = [list(p) for p in PROMPTS[:2]]
    refs = [list(reference(rt, tuple(p))[0][:12]) for p in prompts]
    calls: list = []
    outs, wall = reference_runner(rt, prompts, refs, 12, "dflash_transformers", tiny_prepared.prepared, calls)()
    assert outs == refs and wall > 0


def test_the_peer_row_counts_its_target_calls_like_the_lab(tiny_prepared):
    """transformers' DFlash row counts its target forwards (bench.peers.counted_calls): per prompt a prefill of the
    prompt, then verifies of 1 + up to `width` tokens; its width is the drafts one verify fed, and the lab's dflash
    at that width with the same drafter makes as many target calls (both exact greedy, same drafts)."""
    from dflash_core.bench.peers import call_figures, reference_runner

    rt = tiny_prepared.rt
    prompts = [list(p) for p in PROMPTS[:2]]
    refs = [list(reference(rt, tuple(p))[0][:12]) for p in prompts]
    calls: list = []
    reference_runner(rt, prompts, refs, 12, "dflash_transformers", tiny_prepared.prepared, calls)()
    assert [c[0] for c in calls] == [len(p) for p in prompts]  # the first call is the prefill of the prompt
    fig = call_figures(calls, 12)
    assert fig["prompts"] == 2 and fig["new_tokens"] == 24 and fig["target_calls"] == sum(map(len, calls))
    assert 1 <= fig["width"] <= tiny_prepared.prepared.drafter.cfg.block_size
    ours = [run_method("dflash", rt, tiny_prepared.prepared, p, 12, fig["width"])[1] for p in prompts]
    assert sum(st.target_calls for st in ours) == fig["target_calls"], (calls, [st.target_calls for st in ours])


@pytest.fixture(scope="module")
def imported(tiny_prepared, exported, tmp_path_factory):
    """A fresh home prepared with --drafter (the exported checkpoint): no drafter training, every fitter."""
    from dflash_core.prepare import train

    home = tmp_path_factory.mktemp("imported") / "home"
    rt32 = load_target(str(tiny_prepared.path), "cpu", "float32")
    mp = pytest.MonkeyPatch()
    mp.setattr(train, "train_drafter", lambda *a, **k: pytest.fail("an imported drafter must not be trained"))
    try:
        out = prepare(str(tiny_prepared.path), home=home, cfg=tiny_prepare_config(), rt=rt32, progress=False,
                      drafter=str(exported))
    finally:
        mp.undo()
    return home, out


def test_prepare_with_an_imported_drafter(tiny_prepared, exported, imported):
    home, out = imported
    assert "--drafter-" in out.name
    doc = json.loads((out / "manifest.json").read_text())
    assert doc["drafter"]["imported"] is True and doc["drafter"]["source"] == str(exported)
    prepared = load_prepared(tiny_prepared.rt, home=home, drafter=str(exported))
    want = tiny_prepared.prepared.drafter.state_dict()
    for k, v in prepared.drafter.state_dict().items():
        assert torch.equal(v, want[k]), k
    with pytest.raises(ArtifactError, match="prepare"):  # the trained-drafter home of this target was never built
        load_prepared(tiny_prepared.rt, home=home)


@pytest.mark.parametrize("method", method_ids())
def test_every_method_runs_exact_on_the_imported_drafter(tiny_prepared, exported, imported, method):
    home, _ = imported
    rt = tiny_prepared.rt
    prepared = load_prepared(rt, home=home, drafter=str(exported), required=METHODS[method].needs)
    for p in PROMPTS[:2]:
        ids, _ = run_method(method, rt, prepared, p, 14)
        assert ids == list(reference(rt, tuple(p))[0][:14]), method


def _broken(exported, tmp_path, **changes):
    """`exported` with config.json changed. A changed width comes with weights of that width, a whole drafter made
    for another target (a config edited alone is refused before, by its own weights' shapes in their header)."""
    from dflash_core.prepare.drafter_format import drafter_config_from_hf, export_drafter
    from dflash_core.runtime.drafter import DFlashDrafter

    d = tmp_path / "bad"
    doc = json.loads((exported / "config.json").read_text())
    doc.update(changes)
    if "hidden_size" in changes:
        export_drafter(DFlashDrafter(drafter_config_from_hf(doc, 1 << 16)), None, d)  # config.json replaced below
    else:
        shutil.copytree(exported, d)
    (d / "config.json").write_text(json.dumps(doc))
    return d


@pytest.mark.parametrize("changes, message", [
    ({"hidden_size": 64}, r"hidden size 64 != .* 48"),
    ({"target_layer_ids": [1, 6]}, r"target_layer_ids \[1, 6\] are not layers of .* 6 \(ids 0\.\.5\)"),
    ({"mask_token_id": 5000}, r"mask_token_id 5000 is outside .* vocabulary"),
    ({"dflash_target_vocab_size": 32000}, r"vocabulary of 32000 tokens"),
    ({"dflash_target_tokenizer_sha256": "f" * 64}, r"another tokenizer"),
    ({"model_type": "llama"}, r"model_type 'llama'"),
])
def test_an_incompatible_drafter_is_refused(tiny_prepared, exported, tmp_path, changes, message):
    from dflash_core.prepare import teacher

    bad = _broken(exported, tmp_path, **changes)
    rt32 = load_target(str(tiny_prepared.path), "cpu", "float32")
    mp = pytest.MonkeyPatch()
    mp.setattr(teacher, "teacher_data", lambda *a, **k: pytest.fail("refused only after work began"))
    try:
        with pytest.raises(BadInputError, match=message) as exc:
            prepare(str(tiny_prepared.path), home=tmp_path / "home", cfg=replace(tiny_prepare_config()), rt=rt32,
                    progress=False, drafter=str(bad))
    finally:
        mp.undo()
    assert "--drafter" in str(exc.value)


def test_cli_refuses_a_drafter_directory_without_config(tiny_prepared, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    rc = cli.main(["prepare", "--target", str(tiny_prepared.path), "--home", str(tmp_path / "h"), "--drafter",
                   str(tmp_path / "empty")])
    assert rc == 2
    assert "no config.json" in capsys.readouterr().err


def test_model_card_skips_a_report_it_cannot_read_safely(tmp_path):
    """The reports folder is the user's: a FIFO named benchmark.json (which would block), a list instead of an
    object or a report of another drafter are skipped, never a hang or a traceback; a matching report is found."""
    import os

    from dflash_core.prepare.model_card import find_report

    good = {"provenance": {"artifacts": {"files": {"drafter.safetensors": {"sha256": "a" * 64}}}},
            "target": {"content_sha256": "b" * 64}, "runs": [{"datetime": "2026-12-01"}]}
    for name, body in (("cpu", good), ("x", [1, 2]), ("y", {**good, "target": "not a dict"})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "benchmark.json").write_text(json.dumps(body))
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "benchmark.json")
    assert find_report([tmp_path], "a" * 64, "b" * 64) == good
    assert find_report([tmp_path], "c" * 64, "b" * 64) is None


def test_a_drafter_with_the_anchor_feature_is_refused_with_the_fix(tiny_prepared, tmp_path):
    """transformers' DFlash drafter has no weight for the anchor feature: exporting one would draft without it."""
    from dflash_core.prepare.drafter_format import export_drafter
    from dflash_core.runtime.drafter import init_drafter

    d = init_drafter(replace(tiny_prepared.prepared.drafter.cfg, anchor_feature="block"), seed=0)
    with pytest.raises(BadInputError, match="anchor_feature 'block'.*export a drafter prepared without it"):
        export_drafter(d, tiny_prepared.rt.config, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_drafter_with_the_anchor_embedding_is_refused_with_the_fix(tiny_prepared, tmp_path):
    """transformers' DFlash drafter feeds the MASK rows the MASK embedding alone: exporting an `anchor_embed`
    drafter would draft otherwise than the lab's."""
    from dflash_core.prepare.drafter_format import export_drafter
    from dflash_core.runtime.drafter import init_drafter

    d = init_drafter(replace(tiny_prepared.prepared.drafter.cfg, anchor_embed=True), seed=0)
    with pytest.raises(BadInputError, match="anchor_embed"):
        export_drafter(d, tiny_prepared.rt.config, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_conversion_refuses_a_drafter_transformers_would_draft_otherwise(tiny_prepared):
    """The bench's dflash_transformers row converts the prepared drafter (`to_hf_model`): a drafter the format cannot
    hold is refused there too, not converted into another drafter timed under its name."""
    from dflash_core.prepare.drafter_format import not_representable, to_hf_model
    from dflash_core.runtime.drafter import init_drafter

    cfg = tiny_prepared.prepared.drafter.cfg
    assert not_representable(cfg) is None
    for bad in (replace(cfg, anchor_embed=True), replace(cfg, anchor_feature="mask")):
        with pytest.raises(BadInputError, match="transformers' DFlash drafter"):
            to_hf_model(init_drafter(bad, seed=0), tiny_prepared.rt.config)
