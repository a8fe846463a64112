"""The model card (README.md) `export-drafter` writes beside config.json and model.safetensors.

Why a card: a drafter is useless without its target (it reads the target's hidden states) and without knowing how
good it is; the Hugging Face hub reads the YAML front matter (library, license, base model, tags) and shows the
rest. Every figure in the card comes from the prepared home's manifest (training data, held-out accuracy) or from
a benchmark report that measured this very drafter (matched by its SHA-256); a figure neither holds is written
"not measured", never estimated.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from ..errors import DFlashError
from ..runtime.device import DEVICE_RE
from ..safeio import read_json

TAGS = ("dflash", "speculative-decoding", "draft-model", "dflash-mini-lab")
NOT_MEASURED = "not measured"


def _q(s: object) -> str:
    """A YAML scalar that is always a string: JSON's double-quoted form is valid YAML."""
    return json.dumps(str(s))


def front_matter(identity: dict, kind: str) -> dict:
    """The metadata the hub reads. `base_model` only for a hub target (the hub links it; a local checkpoint has no
    id). No `pipeline_tag`: the drafter generates nothing alone (it drafts for its target inside
    `generate(assistant_model=...)`), so a text-generation widget on it could not run. License: the lab's (MIT)
    for weights trained on a lab-built or local target; `other` for a hub target, whose license governs what is
    trained on its outputs."""
    meta: dict = {"library_name": "transformers"}
    if kind == "hub":
        meta.update(license="other", license_name="same-as-base-model", base_model=identity.get("name"))
    else:
        meta["license"] = "mit"
    meta["tags"] = list(TAGS)
    return meta


def _yaml(meta: dict) -> str:
    lines = []
    for k, v in meta.items():
        if isinstance(v, list):
            lines.append(f"{k}:")
            lines += [f"- {_q(x)}" for x in v]
        else:
            lines.append(f"{k}: {_q(v)}")
    return "---\n" + "\n".join(lines) + "\n---\n"


def _f(x, nd: int = 3) -> str:
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else NOT_MEASURED


def measured_tau(report: dict | None) -> dict | None:
    """Tokens per target call of plain dflash per width, with what they were measured on, from a benchmark.json
    document (None when there is none or it holds no dflash rows)."""
    if not isinstance(report, dict):
        return None
    rows = _dig(report, "methods", "dflash", "rows")
    tau = {int(w): r.get("tokens_per_target_call") for w, r in (rows.items() if isinstance(rows, dict) else ())
           if isinstance(r, dict) and isinstance(w, str) and COUNT_RE.match(w)}
    if not tau:
        return None
    st = report.get("settings") if isinstance(report.get("settings"), dict) else {}
    runs = report.get("runs")
    run = runs[0] if isinstance(runs, list) and runs and isinstance(runs[0], dict) else {}
    return {"tau": dict(sorted(tau.items())), "prompts": _plain(st.get("prompt_limit"), COUNT_RE),
            "tokens": _plain(st.get("tokens"), COUNT_RE), "device": _plain(report.get("device"), DEVICE_RE),
            "datetime": _plain(run.get("datetime"), DATETIME_RE), "commit": _plain(run.get("commit"), COMMIT_RE)}


# What of a report may enter the card (markdown, shown by the hub): a device name, an ISO datetime, a commit id and
# counts, each by its spelling; any other text (markup, a backtick closing the code span) is left out as "?".
COUNT_RE = re.compile(r"^[0-9]{1,9}$")
DATETIME_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9:.]{1,15}([+-][0-9:]{1,5}|Z)?)?$")
COMMIT_RE = re.compile(r"^[0-9a-f]{7,64}$")


def _plain(v: object, spelling: re.Pattern) -> str | None:
    """`v` as text when it is spelled as `spelling` allows, else None (the card says "?")."""
    text = str(v) if isinstance(v, (str, int)) and not isinstance(v, bool) else None
    return text if text is not None and spelling.match(text) else None


def _dig(doc, *keys):
    """doc[k1][k2]... or None where a level is missing or not a dict (a report's shape is not trusted)."""
    for k in keys:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(k)
    return doc


def find_report(roots: list[Path], drafter_sha256: str | None, content_sha256: str | None,
                check: Callable[[dict, str], None] | None = None) -> dict | None:
    """The newest benchmark.json under `roots` (<root>/<device>/benchmark.json) that measured this drafter (the
    same drafter.safetensors SHA-256) on this target (the same content SHA-256); None when none did.

    `check(doc, path)`: the report loader's validation (report.schema.check_benchmark, passed in by the command:
    prepare sits below report), run on each report of this drafter; it raises on a malformed one, which is then
    refused with its path rather than read into the card. Reports of other drafters are only skipped."""
    if not drafter_sha256:
        return None
    found = []
    for root in roots:
        for p in sorted(Path(root).glob("*/benchmark.json")):
            try:  # a report is a user's file: bounded, regular, finite (safeio); one that is not is skipped
                doc = read_json(p, "report", DFlashError, "")
            except DFlashError:
                continue
            if _dig(doc, "provenance", "artifacts", "files", "drafter.safetensors", "sha256") == drafter_sha256 \
                    and _dig(doc, "target", "content_sha256") == content_sha256:
                if check is not None:
                    check(doc, str(p))
                runs = doc.get("runs")
                first = runs[0] if isinstance(runs, list) and runs and isinstance(runs[0], dict) else {}
                found.append((str(first.get("datetime") or ""), p, doc))
    return max(found, key=lambda t: (t[0], str(t[1])))[2] if found else None


def _training(man: dict) -> list[str]:
    dr, teacher, seeds = man.get("drafter") or {}, man.get("teacher") or {}, man.get("seeds") or {}
    held = man.get("held_out") or {}
    if dr.get("imported"):
        return [f"Not trained here: imported from `{dr.get('source')}` (SHA-256 `{dr.get('source_sha256')}`); its "
                "training data is that drafter's own."]
    out = [f"* Teacher trajectories: the target's own greedy continuations of {seeds.get('train_seed_count', '?')} "
           f"train prompts of the lab's `{seeds.get('family', '?')}` prompt set, {teacher.get('tokens_per_seed', '?')} "
           f"tokens each: **{teacher.get('sequences', '?')} sequences, {teacher.get('tokens', '?')} tokens**.",
           f"* Split: {dr.get('train_sequences', '?')} training and {dr.get('heldout_sequences', '?')} held-out "
           f"trajectories; {dr.get('steps_run', '?')} steps run, the step with the best held-out accuracy kept "
           f"(step {dr.get('best_step', '?')}); final training loss {_f(dr.get('final_loss'))}."]
    if held.get("trajectories_checked"):
        out.append(f"* Held out: no trajectory shares an 8-unit n-gram with a benchmark or calibration prompt "
                   f"({held.get('trajectories_dropped', 0)} of {held.get('trajectories_generated', '?')} generated "
                   "were dropped before training).")
    return out


def _accuracy(man: dict) -> list[str]:
    dr = man.get("drafter") or {}
    held, train = dr.get("heldout_position_accuracy"), dr.get("train_position_accuracy")
    if not isinstance(held, list) or not held:
        return [f"Held-out accuracy per draft position: {NOT_MEASURED}."]
    train = train if isinstance(train, list) else []
    rows = ["| draft position | held-out accuracy | training accuracy |", "|---|---|---|"]
    rows += [f"| {i + 1} | {_f(a)} | {_f(train[i]) if i < len(train) else NOT_MEASURED} |" for i, a in enumerate(held)]
    return ["Teacher-forced accuracy of the drafted token at each position of a block, on the "
            f"{dr.get('heldout_sequences', '?')} held-out trajectories (and, for the overfit gap, as many training "
            "trajectories):", "", *rows, "", f"Mean held-out accuracy: {_f(sum(held) / len(held))}."]


def _tau(measured: dict | None) -> list[str]:
    if not measured:
        return [f"Tokens per target call (τ) on the lab's benchmark prompts: **{NOT_MEASURED}** (no benchmark "
                "report of this drafter was found; `./lab bench` measures it, then export again)."]
    rows = ["| verify width | τ (tokens per target call) |", "|---|---|"]
    rows += [f"| {w} | {_f(t, 2)} |" for w, t in measured["tau"].items()]
    return [f"Plain DFlash with this drafter (the same SHA-256) on {measured.get('prompts') or '?'} held-out benchmark "
            f"prompts x {measured.get('tokens') or '?'} tokens, greedy and token-exact "
            f"(`./lab bench`, {measured.get('device') or '?'}, {measured.get('datetime') or '?'}, commit "
            f"`{str(measured.get('commit') or '?')[:12]}`):", "", *rows]


def model_card(identity: dict, manifest: dict, kind: str, dcfg: dict, measured: dict | None = None) -> str:
    """README.md for the exported drafter: front matter, target, drafter, training data, accuracy, τ, usage."""
    name = str(identity.get("name") or "the target")
    target_ref = name if kind == "hub" else "/path/to/the/target"  # transformers loads a directory or a hub id
    lab_ref = name if kind in ("hub", "mini") else "/path/to/the/target"  # the lab also knows "mini"
    block = int(dcfg.get("block_size", 0))
    taps = list(dcfg.get("taps") or [])
    ident_rows = [("name", name), ("model type", identity.get("model_type")),
                  ("content SHA-256", identity.get("content_sha256")),
                  ("weights SHA-256", identity.get("weights_sha256")),
                  ("tokenizer SHA-256", identity.get("tokenizer_sha256")), ("parameters", identity.get("parameters"))]
    if identity.get("hub_commit"):
        ident_rows.append(("hub commit", identity["hub_commit"]))
    where = ("" if kind == "hub" else
             f"\n`{name}` is a {'lab-built mini' if kind == 'mini' else 'local'} target, not a hub id: point "
             "`TARGET` at its directory (`python -m dflash_core prepare --target mini` builds the mini target into "
             "`$DFLASH_HOME`); its content SHA-256 must be the one above.\n")
    return "\n".join([
        _yaml(front_matter(identity, kind)).rstrip("\n"),
        "",
        f"# DFlash drafter for {name}",
        "",
        f"A block drafter for lossless speculative decoding with `{name}`: from the target's hidden states at layers "
        f"{taps} it drafts {block} tokens per block in one forward, the target verifies them in one forward, and "
        "the output is exactly the target's greedy output. Exported by DFlash Mini Lab "
        "(`python -m dflash_core export-drafter`) in transformers' DFlash format (`MuseGlimmerAssistantModel`, "
        f"`block_size` {block + 1} counts the anchor row). It only works with the target below: it reads that "
        "target's hidden states, and `config.json` records the target's content SHA-256 "
        "(`dflash_target_content_sha256`).",
        "",
        "## Target",
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | `{v}` |" for k, v in ident_rows],
        "",
        "## Training data",
        "",
        *_training(manifest),
        "",
        "## Held-out accuracy",
        "",
        *_accuracy(manifest),
        "",
        "## Tokens per target call",
        "",
        *_tau(measured),
        "",
        "## Use with transformers (>= 5.24)",
        "",
        "Greedy DFlash generation; the drafter runs in the target's dtype (transformers passes it the target's "
        "hidden states unconverted).",
        "",
        "```python",
        "from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer",
        "",
        f"TARGET = {_q(target_ref)}",
        "DRAFTER = \"/path/to/this/directory\"  # or its hub id",
        "target = AutoModelForCausalLM.from_pretrained(TARGET)",
        "tokenizer = AutoTokenizer.from_pretrained(TARGET)",
        "drafter = AutoModel.from_pretrained(DRAFTER, dtype=target.dtype)",
        "ids = tokenizer(\"def forward(self, hidden_states):\", return_tensors=\"pt\").input_ids",
        "out = target.generate(ids, assistant_model=drafter, speculation_type=\"dflash\", do_sample=False,",
        "                      max_new_tokens=64)",
        "print(tokenizer.decode(out[0, ids.shape[1]:]))",
        "```",
        where,
        "## Use with DFlash Mini Lab",
        "",
        "```bash",
        f"python -m dflash_core prepare --target {lab_ref} --drafter /path/to/this/directory  # fits the methods",
        f"python -m dflash_core run --target {lab_ref} --drafter /path/to/this/directory --method dflash "
        "--prompt \"def forward(self, hidden_states):\"",
        f"python -m dflash_core bench --target {lab_ref} --drafter /path/to/this/directory  # all 15 methods, "
        "with the report",
        "```",
        "",
    ])
