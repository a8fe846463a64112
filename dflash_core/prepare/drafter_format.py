"""Our DFlash drafter <-> transformers' DFlash drafter format (`MuseGlimmerAssistantModel`, transformers >= 5.24).

The two architectures are the same: `fc` over the concatenated target layer taps + RMSNorm, the fused
context injected as K/V into every layer, a non-causal block [anchor, mask x (block_size - 1)] whose rows
are the target's embeddings, QK-norm, RoPE, SwiGLU, a final RMSNorm, the target's LM head. So conversion is
a renaming of weights and config fields, and one count: transformers' `block_size` counts the anchor row,
ours counts the drafted tokens (theirs = ours + 1).

* `export_drafter` writes config.json + model.safetensors through `MuseGlimmerAssistantModel.save_pretrained`
  (a strict `load_state_dict` first proves the mapping covers every weight), and the model card README.md;
  `AutoModel.from_pretrained`
  loads it, and `generate(assistant_model=..., speculation_type="dflash")` drafts with it.
* `load_hf_drafter` reads such a checkpoint (a local directory or a hub id) back into our `DFlashDrafter`
  without running or unpickling anything (config.json + safetensors), and `check_compatible` refuses a
  drafter made for another target (hidden size, taps beyond its layers, vocabulary) with the fix.
* A draft vocabulary (`DrafterConfig.draft_vocab`, the map `d2t`) has no transformers field: the export records
  it in config.json as `dflash_draft_vocab_size` and `dflash_draft_to_target` (K target ids), which
  `load_hf_drafter` reads back (checked: K, shape, range, uniqueness). transformers' own `generate` ignores them
  and drafts over the full head: other drafts, still lossless, since the target verifies every token.
* The anchor feature (`DrafterConfig.anchor_feature`) has no transformers counterpart at all: such a drafter is
  refused by `export_drafter` with the fix (a lab bundle carries it).
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

from ..errors import ArtifactError, BadInputError, os_error_message
from ..runtime.drafter import DFlashDrafter, DrafterConfig, check_draft_map
from ..safeio import check_out_parent, check_regular_file, finite, normal_modes, read_json
from ..store.artifacts import hash_file_into

MODEL_TYPE = "muse_glimmer_assistant"
# Extra config.json fields our export records about the target it was trained for (transformers keeps
# unknown config fields): what `check_compatible` compares with the runtime to catch another vocabulary.
HUB_PATTERNS = ["*.json", "*.safetensors"]  # no *.py, no pickled *.bin: nothing of the checkpoint runs

# our parameter name -> transformers' (per layer: with "layers.{i}." in front of both)
_TOP = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight",
        "final_norm.weight": "norm.weight"}
_LAYER = {"in_norm.weight": "input_layernorm.weight", "q.weight": "self_attn.q_proj.weight",
          "k.weight": "self_attn.k_proj.weight", "v.weight": "self_attn.v_proj.weight",
          "o.weight": "self_attn.o_proj.weight", "q_norm.weight": "self_attn.q_norm.weight",
          "k_norm.weight": "self_attn.k_norm.weight", "mlp_norm.weight": "post_attention_layernorm.weight",
          "gate.weight": "mlp.gate_proj.weight", "up.weight": "mlp.up_proj.weight",
          "down.weight": "mlp.down_proj.weight"}
_LAYER_KEY = re.compile(r"layers\.(\d+)\.(.+)")


def mask_token_for(config) -> int:
    """The mask token prepare trains with: the target's pad token when it is a token of its own (never in text),
    else its unk token, else id 0. Llama-family checkpoints often reuse EOS (or BOS) as pad (SmolLM2: pad = eos =
    <|im_end|>), which does occur in teacher trajectories, so such a pad is passed over."""
    vocab = int(config.vocab_size)

    def ids(name):
        v = getattr(config, name, None)
        return set(v) if isinstance(v, (list, tuple)) else {v}

    taken = ids("eos_token_id") | ids("bos_token_id")
    for name in ("pad_token_id", "unk_token_id"):
        v = getattr(config, name, None)
        if isinstance(v, int) and 0 <= v < vocab and v not in taken:
            return int(v)
    return 0


def _rename(name: str, table_top: dict, table_layer: dict) -> str:
    if name in table_top:
        return table_top[name]
    m = _LAYER_KEY.fullmatch(name)
    if m and m.group(2) in table_layer:
        return f"layers.{m.group(1)}.{table_layer[m.group(2)]}"
    raise KeyError(name)


def to_hf_state_dict(state_dict: dict) -> dict:
    """Our drafter's state dict under transformers' names (the same tensors); the draft vocabulary's map `d2t`
    goes to config.json (`hf_config`), transformers' model has no such weight."""
    return {_rename(k, _TOP, _LAYER): v for k, v in state_dict.items() if k != "d2t"}


def from_hf_state_dict(state_dict: dict) -> dict:
    """A transformers DFlash drafter's weights under our names (a `model.` prefix, if saved with one, dropped)."""
    top = {v: k for k, v in _TOP.items()}
    layer = {v: k for k, v in _LAYER.items()}
    out = {}
    for k, v in state_dict.items():
        key = k[len("model."):] if k.startswith("model.") else k
        try:
            out[_rename(key, top, layer)] = v
        except KeyError:
            raise ArtifactError(f"the drafter checkpoint has a weight {k!r} that a DFlash drafter "
                                f"({MODEL_TYPE}) does not have: it is another architecture; pass a "
                                "transformers-format DFlash drafter") from None
    return out


def hf_config(dcfg, target_config, identity: dict | None = None, d2t=None):
    """transformers' config for our drafter config `dcfg`, with the target's special ids and identity (and the
    draft vocabulary's map `d2t`, when it has one)."""
    from transformers import MuseGlimmerAssistantConfig

    extra = {}
    if dcfg.draft_vocab:
        extra = {"dflash_draft_vocab_size": int(dcfg.draft_vocab),
                 "dflash_draft_to_target": [int(t) for t in d2t.tolist()]}
    if identity:
        extra |= {"dflash_target_vocab_size": int(identity.get("vocab_size", dcfg.vocab_size)),
                 "dflash_target_tokenizer_sha256": identity.get("tokenizer_sha256"),
                 "dflash_target_content_sha256": identity.get("content_sha256")}
    return MuseGlimmerAssistantConfig(
        hidden_size=dcfg.hidden_size, intermediate_size=dcfg.intermediate_size,
        num_hidden_layers=dcfg.num_layers, num_attention_heads=dcfg.num_heads,
        num_key_value_heads=dcfg.num_kv_heads, head_dim=dcfg.head_dim, rms_norm_eps=dcfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(dcfg.rope_theta)},
        max_position_embeddings=int(getattr(target_config, "max_position_embeddings", None) or 131072),
        layer_types=["full_attention"] * dcfg.num_layers, hidden_act="silu",
        bos_token_id=getattr(target_config, "bos_token_id", None),
        eos_token_id=getattr(target_config, "eos_token_id", None),
        pad_token_id=getattr(target_config, "pad_token_id", None),
        block_size=dcfg.block_size + 1, mask_token_id=dcfg.mask_token_id, target_layer_ids=list(dcfg.taps),
        **extra)


def not_representable(cfg) -> str | None:
    """Why transformers' DFlash drafter cannot draft as this drafter config does (None: it can). The anchor feature
    has no weight there and the anchor embedding no counterpart, so a conversion would silently draft otherwise."""
    if cfg.anchor_feature != "off":
        return (f"this drafter adds the anchor feature (anchor_feature {cfg.anchor_feature!r}), which transformers' "
                f"DFlash drafter ({MODEL_TYPE}) has no weight for")
    if cfg.anchor_embed:
        return (f"this drafter adds the anchor's embedding to its MASK rows (anchor_embed), which transformers' "
                f"DFlash drafter ({MODEL_TYPE}) does not do")
    return None


def to_hf_model(drafter, target_config, identity: dict | None = None):
    """A `MuseGlimmerAssistantModel` holding our drafter's weights (strict: every weight mapped, none left); a
    drafter it cannot represent (`not_representable`) is refused rather than converted into another drafter."""
    import torch

    why = not_representable(drafter.cfg)
    if why:
        raise BadInputError(why)
    from transformers import MuseGlimmerAssistantModel

    cfg = hf_config(drafter.cfg, target_config, identity, getattr(drafter, "d2t", None))
    p = next(drafter.parameters())
    model = MuseGlimmerAssistantModel(cfg).to(dtype=p.dtype, device=p.device)
    with torch.no_grad():
        model.load_state_dict(to_hf_state_dict(drafter.state_dict()), strict=True)
    return model.eval()


def export_drafter(drafter, target_config, out: str | Path, identity: dict | None = None,
                   card: str | None = None) -> Path:
    """Write the drafter as a transformers checkpoint (config.json + model.safetensors, float32) into `out`, with
    its model card as README.md when given (`model_card.model_card`; not part of the drafter's digest).

    Written into a temp directory beside `out`, then moved into place: a reader never sees half a checkpoint.
    """
    from safetensors import SafetensorError

    out = Path(out)
    why = not_representable(drafter.cfg)
    if why:
        raise BadInputError(f"{why}: export a drafter prepared without it (bundles carry this one: `python -m "
                            "dflash_core export`)")
    check_drafter_out(out)
    model = to_hf_model(copy.deepcopy(drafter).float().cpu(), target_config, identity)
    tmp = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(tmp))
        if card is not None:
            (tmp / "README.md").write_text(card, encoding="utf-8")
        normal_modes(tmp)  # save_pretrained leaves model.safetensors 0600
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    except OSError as exc:
        raise BadInputError(os_error_message(exc, writing=str(out)) + "; nothing was written") from exc
    except SafetensorError as exc:  # safetensors reports a failed write as its own error, with the OS's errno
        code = re.search(r"os error (\d+)", str(exc))
        err = OSError(int(code.group(1)), str(exc)) if code else OSError(str(exc))
        raise BadInputError(os_error_message(err, writing=str(out)) + "; nothing was written") from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def check_drafter_out(out: Path) -> None:
    """export-drafter's --out: a new or empty directory under a directory (checked before loading anything)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInputError(f"--out {out} exists and is not an empty directory: name a new directory")
    check_out_parent(out, BadInputError)


# --- import ---------------------------------------------------------------------------------------------

def resolve_drafter_source(source: str, revision: str | None = None) -> Path:
    """A local directory, or a hub id's snapshot (config + safetensors only). Unusable names say what to pass."""
    p = Path(source).expanduser()
    if p.is_dir():
        if not (p / "config.json").exists():
            raise BadInputError(f"--drafter {source}: the directory has no config.json; pass a directory written "
                                "by `python -m dflash_core export-drafter` or any transformers DFlash drafter")
        check_drafter_dir(p)
        return p
    if source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise BadInputError(f"--drafter {source!r} is neither an existing directory nor a hub id (owner/name)")
    from huggingface_hub import snapshot_download

    try:
        snap = Path(snapshot_download(source, revision=revision, allow_patterns=HUB_PATTERNS))
    except Exception as exc:  # offline, unknown repo, HTTP: all mean the same to the user
        raise BadInputError(f"could not fetch the drafter {source!r} from the hub or its cache ({type(exc).__name__}"
                            "); without hub access download it elsewhere and pass --drafter /path/to/dir") from exc
    check_drafter_dir(snap)
    return snap


# Any vocabulary that holds every id config.json may name: a drafter's weights have no vocabulary-sized shape (the
# head is the target's), so their expected shapes can be checked before the target is loaded.
ANY_VOCAB = (1 << 24) + 1


def check_drafter_dir(directory: Path) -> None:
    """Everything about a drafter directory that needs no model: config.json's schema and bounds, weight files
    that are regular files (a FIFO or a link to /dev/zero would hang the digest), and the weights' shapes and dtypes
    in their headers against config.json (refused before the target loads, not after)."""
    doc = read_hf_config(directory)
    files = weight_files(directory)
    if files:  # none at all: load_hf_drafter says so, with the fix
        check_weight_header(directory, files, drafter_config_from_hf(doc, ANY_VOCAB))


def weight_files(directory: Path) -> list[Path]:
    """The drafter's *.safetensors files, each a regular file of bounded size (stat before open)."""
    files = sorted(directory.glob("*.safetensors"))
    for f in files:
        check_regular_file(f, "--drafter weight file", BadInputError, "pass a drafter whose *.safetensors are plain "
                           "files", max_bytes=MAX_DRAFTER_PARAMETERS * 8)
    return files


def drafter_digest(directory: Path) -> str:
    """SHA-256 over config.json and every *.safetensors file (names and bytes): the drafter's identity."""
    h = hashlib.sha256()
    for p in [directory / "config.json", *weight_files(directory)]:
        h.update(p.name.encode())
        hash_file_into(h, p)
    return h.hexdigest()


# Bounds on a drafter's config, checked before anything is allocated (a config asking for 100,000 layers or an
# intermediate size of 1e9 allocated terabytes). Published DFlash drafters are far inside them.
MAX_DRAFTER_LAYERS = 64
MAX_DRAFTER_HIDDEN = 16384
MAX_DRAFTER_INTERMEDIATE = 131072
MAX_DRAFTER_HEADS = 256
MAX_DRAFTER_BLOCK = 65  # transformers' count (anchor + drafted tokens)
MAX_DRAFTER_PARAMETERS = 4_000_000_000
INT_FIELDS = {"hidden_size": MAX_DRAFTER_HIDDEN, "num_hidden_layers": MAX_DRAFTER_LAYERS,
              "num_attention_heads": MAX_DRAFTER_HEADS, "intermediate_size": MAX_DRAFTER_INTERMEDIATE,
              "block_size": MAX_DRAFTER_BLOCK, "mask_token_id": 1 << 24}
OPTIONAL_INT_FIELDS = {"head_dim": 4096, "num_key_value_heads": MAX_DRAFTER_HEADS}


def _int_in(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def check_hf_config(doc: dict, where: str) -> None:
    """Required fields, their types and sane bounds (see the MAX_DRAFTER_* limits), or a BadInputError naming
    the field: a drafter config is checked before any tensor is allocated."""
    fix = "pass a transformers-format DFlash drafter (e.g. one written by `python -m dflash_core export-drafter`)"
    for k, hi in INT_FIELDS.items():
        lo = 0 if k == "mask_token_id" else 2 if k == "block_size" else 1
        if not _int_in(doc.get(k), lo, hi):
            raise BadInputError(f"--drafter {where}: config.json field {k} is {str(doc.get(k))[:40]!r}, not an "
                                f"integer in {lo}..{hi}: {fix}")
    for k, hi in OPTIONAL_INT_FIELDS.items():
        if doc.get(k) is not None and not _int_in(doc[k], 1, hi):
            raise BadInputError(f"--drafter {where}: config.json field {k} is {str(doc[k])[:40]!r}, not an integer "
                                f"in 1..{hi} (or absent): {fix}")
    taps = doc.get("target_layer_ids")
    if not (isinstance(taps, list) and 1 <= len(taps) <= 64 and all(_int_in(t, 0, 4095) for t in taps)):
        raise BadInputError(f"--drafter {where}: config.json field target_layer_ids is {str(taps)[:60]!r}, not a "
                            f"list of 1..64 layer ids (integers >= 0): {fix}")
    eps = doc.get("rms_norm_eps")
    if not (finite(eps) and 0 < eps < 1):
        raise BadInputError(f"--drafter {where}: config.json field rms_norm_eps is {str(eps)[:40]!r}, not a number "
                            f"in (0, 1): {fix}")
    rope = doc.get("rope_parameters")
    if rope is not None and not (isinstance(rope, dict) and finite(rope.get("rope_theta", 1.0))
                                 and rope.get("rope_theta", 1.0) > 0):
        raise BadInputError(f"--drafter {where}: config.json field rope_parameters must be an object with a "
                            f"positive rope_theta: {fix}")
    if doc.get("dflash_target_vocab_size") is not None and not _int_in(doc["dflash_target_vocab_size"], 1, 1 << 24):
        raise BadInputError(f"--drafter {where}: config.json field dflash_target_vocab_size must be a positive "
                            f"integer: {fix}")
    for k in ("dflash_target_tokenizer_sha256", "dflash_target_content_sha256"):
        if doc.get(k) is not None and not isinstance(doc[k], str):
            raise BadInputError(f"--drafter {where}: config.json field {k} must be a string: {fix}")
    k = doc.get("dflash_draft_vocab_size")
    if k is not None and not _int_in(k, 1, 1 << 24):
        raise BadInputError(f"--drafter {where}: config.json field dflash_draft_vocab_size must be a positive "
                            f"integer: {fix}")
    d2t = doc.get("dflash_draft_to_target")
    if (k is None) != (d2t is None) or (d2t is not None and not (
            isinstance(d2t, list) and len(d2t) == k and all(_int_in(t, 0, (1 << 24) - 1) for t in d2t))):
        raise BadInputError(f"--drafter {where}: config.json fields dflash_draft_vocab_size and "
                            "dflash_draft_to_target must come together, the second a list of that many token ids: "
                            f"{fix}")
    types = doc.get("layer_types")
    if types is not None and not (isinstance(types, list) and all(isinstance(t, str) for t in types)):
        raise BadInputError(f"--drafter {where}: config.json field layer_types must be a list of strings: {fix}")
    H, nh = doc["hidden_size"], doc["num_attention_heads"]
    hd = doc.get("head_dim") or (H // nh if H % nh == 0 else None)
    if hd is None:
        raise BadInputError(f"--drafter {where}: hidden_size {H} is not a multiple of num_attention_heads {nh} and "
                            f"no head_dim is given: {fix}")
    nkv = doc.get("num_key_value_heads") or nh
    if nh % nkv:
        raise BadInputError(f"--drafter {where}: num_attention_heads {nh} is not a multiple of num_key_value_heads "
                            f"{nkv}: {fix}")
    per_layer = 2 * H * nh * hd + 2 * H * nkv * hd + 3 * H * doc["intermediate_size"]
    params = doc["num_hidden_layers"] * per_layer + len(taps) * H * H
    if params > MAX_DRAFTER_PARAMETERS:
        raise BadInputError(f"--drafter {where}: config.json describes about {params:.3g} parameters, more than the "
                            f"{MAX_DRAFTER_PARAMETERS:.0e} this lab loads: {fix}")


def read_hf_config(directory: Path) -> dict:
    """config.json of a transformers DFlash drafter, as data (checked to be one, with sane bounds)."""
    doc = read_json(directory / "config.json", "--drafter config", BadInputError, "re-export the drafter",
                    max_bytes=4 << 20)
    if not isinstance(doc, dict) or doc.get("model_type") != MODEL_TYPE:
        found = doc.get("model_type") if isinstance(doc, dict) else type(doc).__name__
        raise BadInputError(f"--drafter {directory}: config.json has model_type {found!r}, not {MODEL_TYPE!r} "
                            "(transformers' DFlash drafter): pass a DFlash drafter checkpoint")
    check_hf_config(doc, str(directory))
    return doc


def drafter_config_from_hf(doc: dict, vocab_size: int):
    """Our DrafterConfig for a transformers DFlash drafter config (refusing what our drafter cannot run)."""
    n = int(doc.get("num_hidden_layers", 0))
    types = doc.get("layer_types") or ["sliding_attention"] * n
    if any(t != "full_attention" for t in types):
        raise BadInputError(f"the drafter's layers {types} include sliding-window attention, which the lab's "
                            "drafter does not implement: pass a drafter with full_attention layers")
    rope = doc.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or doc.get("hidden_act", "silu") != "silu":
        raise BadInputError(f"the drafter uses rope {rope.get('rope_type')!r} / activation "
                            f"{doc.get('hidden_act')!r}; the lab's drafter runs default RoPE and SiLU only")
    H, nh = int(doc["hidden_size"]), int(doc["num_attention_heads"])
    hd = int(doc.get("head_dim") or H // nh)
    nkv = int(doc.get("num_key_value_heads") or nh)
    return DrafterConfig(hidden_size=H, vocab_size=int(vocab_size), taps=tuple(int(t) for t in doc["target_layer_ids"]),
                         block_size=int(doc["block_size"]) - 1, num_layers=n, num_heads=nh,
                         intermediate_size=int(doc["intermediate_size"]),
                         rope_theta=float(rope.get("rope_theta", 500000.0)), norm_eps=float(doc["rms_norm_eps"]),
                         mask_token_id=int(doc["mask_token_id"]),
                         kv_heads=None if nkv == nh else nkv,
                         attn_head_dim=None if hd == H // nh else hd,
                         draft_vocab=int(doc.get("dflash_draft_vocab_size") or 0))


def check_compatible(doc: dict, rt, identity: dict | None = None) -> None:
    """Refuse a drafter made for another target: each reason names the mismatch and the fix."""
    fix = "pass a drafter trained for this target, or omit --drafter to train one with prepare"
    name = getattr(rt, "name", "the target")
    if int(doc["hidden_size"]) != rt.hidden_size:
        raise BadInputError(f"--drafter: hidden size {doc['hidden_size']} != {name}'s {rt.hidden_size} (the fc "
                            f"over the target's layer taps cannot apply): {fix}")
    taps = [int(t) for t in doc.get("target_layer_ids") or []]
    if not taps or min(taps) < 0 or max(taps) >= rt.num_layers:
        raise BadInputError(f"--drafter: target_layer_ids {taps} are not layers of {name}, which has "
                            f"{rt.num_layers} (ids 0..{rt.num_layers - 1}): {fix}")
    if int(doc.get("block_size", 0)) < 2:
        raise BadInputError(f"--drafter: block_size {doc.get('block_size')} drafts no token (needs >= 2): {fix}")
    mask = int(doc.get("mask_token_id", -1))
    if not 0 <= mask < rt.vocab_size:
        raise BadInputError(f"--drafter: mask_token_id {mask} is outside {name}'s vocabulary of {rt.vocab_size} "
                            f"(it was made for another vocabulary): {fix}")
    vocab = doc.get("dflash_target_vocab_size")
    if vocab is not None and int(vocab) != rt.vocab_size:
        raise BadInputError(f"--drafter: it was made for a vocabulary of {vocab} tokens, {name} has "
                            f"{rt.vocab_size}: {fix}")
    tok = doc.get("dflash_target_tokenizer_sha256")  # recorded by our export; published drafters lack it
    have = (identity or {}).get("tokenizer_sha256")
    if tok and identity is not None and tok != have:
        raise BadInputError(f"--drafter: it was made for another tokenizer (sha256 {str(tok)[:12]}... != "
                            f"{str(have)[:12]}...): its token ids mean other text; {fix}")


def load_hf_drafter(directory: Path, rt, identity: dict | None = None):
    """Our DFlashDrafter (float32, eval) from a transformers DFlash drafter directory, checked against `rt`."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    doc = read_hf_config(directory)
    check_compatible(doc, rt, identity)
    dcfg = drafter_config_from_hf(doc, rt.vocab_size)
    files = weight_files(directory)
    if not files:
        raise ArtifactError(f"--drafter {directory}: no *.safetensors weights (the lab never loads pickled .bin "
                            "weights): re-save the drafter with safetensors")
    check_weight_header(directory, files, dcfg)  # shapes and dtypes from the header, before a tensor is read
    sd: dict[str, Any] = {}
    try:
        for f in files:
            sd.update(load_file(str(f)))
    except (SafetensorError, OSError) as exc:
        raise ArtifactError(f"--drafter {directory}: the weights are unreadable ({exc}): re-export or "
                            "re-download the drafter") from exc
    bad = [k for k, t in sd.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise BadInputError(f"--drafter {directory}: weights {sorted(bad)[:4]} hold NaN or infinite values: the "
                            "checkpoint is broken; re-export or re-download it")
    d2t = doc.get("dflash_draft_to_target")
    d2t = None if d2t is None else torch.tensor(d2t, dtype=torch.long)
    try:
        check_draft_map(dcfg, d2t, f"--drafter {directory}")
    except ValueError as exc:
        raise BadInputError(f"{exc}: re-export the drafter for this target") from exc
    drafter = DFlashDrafter(dcfg)
    ours = from_hf_state_dict(sd)
    if d2t is not None:
        ours["d2t"] = d2t
    try:  # strict: the header check above already matched every name and shape
        drafter.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in ours.items()}, strict=True)
    except RuntimeError as exc:
        raise ArtifactError(f"--drafter {directory}: a weight has the wrong shape for its config.json "
                            f"({str(exc).splitlines()[-1].strip()[:200]}): the checkpoint is inconsistent") from exc
    return drafter.to(torch.float32).eval()


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names of the weight dtypes the lab loads (as float32)


def header_shapes(directory: Path, files: list[Path]) -> dict[str, tuple[list[int], str]]:
    """Each weight's shape and dtype from the safetensors headers (safe_open reads the header, not the data)."""
    from safetensors import SafetensorError, safe_open

    out: dict[str, tuple[list[int], str]] = {}
    try:
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    sl = h.get_slice(k)
                    out[k] = (list(sl.get_shape()), str(sl.get_dtype()))
    except (SafetensorError, OSError) as exc:
        raise ArtifactError(f"--drafter {directory}: the weights are unreadable ({exc}): re-export or "
                            "re-download the drafter") from exc
    return out


def check_weight_header(directory: Path, files: list[Path], dcfg) -> None:
    """Refuse weights whose header disagrees with config.json (a missing, unknown, misshapen or non-float weight)
    before any tensor is read: loading first let a header claim gigabytes for one weight and allocate all of it.
    The expected shapes come from the drafter itself, built on the meta device (no memory), so they cannot drift
    from the model's definition."""
    import torch

    with torch.device("meta"):
        want = {k: list(v.shape) for k, v in DFlashDrafter(dcfg).state_dict().items() if k != "d2t"}
    have = from_hf_state_dict(header_shapes(directory, files))
    missing = sorted(set(want) - set(have))
    if missing:
        raise ArtifactError(f"--drafter {directory}: weights {missing[:4]} are missing: the checkpoint is "
                            "incomplete; re-export or re-download it")
    fix = "the checkpoint does not match its config.json; re-export or re-download it"
    for k in sorted(want):
        shape, dtype = have[k]
        if dtype not in FLOAT_DTYPES:
            raise BadInputError(f"--drafter {directory}: weight {_rename(k, _TOP, _LAYER)} is {dtype}, not a float "
                                f"type ({', '.join(FLOAT_DTYPES)}): {fix}")
        if shape != want[k]:
            raise BadInputError(f"--drafter {directory}: weight {_rename(k, _TOP, _LAYER)} has shape "
                                f"{str(shape)[:60]}, config.json implies {want[k]}: {fix}")
