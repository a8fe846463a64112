"""Our DFlash drafter <-> transformers' DFlash drafter format (`MuseGlimmerAssistantModel`, transformers >= 5.24).

The two architectures are the same: `fc` over the concatenated target layer taps + RMSNorm, the fused
context injected as K/V into every layer, a non-causal block [anchor, mask x (block_size - 1)] whose rows
are the target's embeddings, QK-norm, RoPE, SwiGLU, a final RMSNorm, the target's LM head. So conversion is
a renaming of weights and config fields, and one count: transformers' `block_size` counts the anchor row,
ours counts the drafted tokens (theirs = ours + 1).

* `export_drafter` writes config.json + model.safetensors through `MuseGlimmerAssistantModel.save_pretrained`
  (a strict `load_state_dict` first proves the mapping covers every weight); `AutoModel.from_pretrained`
  loads it, and `generate(assistant_model=..., speculation_type="dflash")` drafts with it.
* `load_hf_drafter` reads such a checkpoint (a local directory or a hub id) back into our `DFlashDrafter`
  without running or unpickling anything (config.json + safetensors), and `check_compatible` refuses a
  drafter made for another target (hidden size, taps beyond its layers, vocabulary) with the fix.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any

from ..errors import ArtifactError, BadInputError

MODEL_TYPE = "muse_glimmer_assistant"
# Extra config.json fields our export records about the target it was trained for (transformers keeps
# unknown config fields): what `check_compatible` compares with the runtime to catch another vocabulary.
TARGET_FIELDS = ("dflash_target_vocab_size", "dflash_target_tokenizer_sha256", "dflash_target_content_sha256")
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
    """Our drafter's state dict under transformers' names (the same tensors)."""
    return {_rename(k, _TOP, _LAYER): v for k, v in state_dict.items()}


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


def hf_config(dcfg, target_config, identity: dict | None = None):
    """transformers' config for our drafter config `dcfg`, with the target's special ids and identity."""
    from transformers import MuseGlimmerAssistantConfig

    extra = {}
    if identity:
        extra = {"dflash_target_vocab_size": int(identity.get("vocab_size", dcfg.vocab_size)),
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


def to_hf_model(drafter, target_config, identity: dict | None = None):
    """A `MuseGlimmerAssistantModel` holding our drafter's weights (strict: every weight mapped, none left)."""
    import torch
    from transformers import MuseGlimmerAssistantModel

    cfg = hf_config(drafter.cfg, target_config, identity)
    p = next(drafter.parameters())
    model = MuseGlimmerAssistantModel(cfg).to(dtype=p.dtype, device=p.device)
    with torch.no_grad():
        model.load_state_dict(to_hf_state_dict(drafter.state_dict()), strict=True)
    return model.eval()


def export_drafter(drafter, target_config, out: str | Path, identity: dict | None = None) -> Path:
    """Write the drafter as a transformers checkpoint (config.json + model.safetensors, float32) into `out`.

    Written into a temp directory beside `out`, then moved into place: a reader never sees half a checkpoint.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadInputError(f"--out {out} exists and is not an empty directory: name a new directory")
    model = to_hf_model(copy.deepcopy(drafter).float().cpu(), target_config, identity)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
    try:
        model.save_pretrained(str(tmp))
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


# --- import ---------------------------------------------------------------------------------------------

def resolve_drafter_source(source: str, revision: str | None = None) -> Path:
    """A local directory, or a hub id's snapshot (config + safetensors only). Unusable names say what to pass."""
    p = Path(source).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise BadInputError(f"--drafter {source}: the directory has no config.json; pass a directory written "
                                "by `python -m dflash_core export-drafter` or any transformers DFlash drafter")
        return p
    if source.startswith((".", "/", "~")) or source.count("/") != 1:
        raise BadInputError(f"--drafter {source!r} is neither an existing directory nor a hub id (owner/name)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(source, revision=revision, allow_patterns=HUB_PATTERNS))
    except Exception as exc:  # offline, unknown repo, HTTP: all mean the same to the user
        raise BadInputError(f"could not fetch the drafter {source!r} from the hub or its cache ({type(exc).__name__}"
                            "); without hub access download it elsewhere and pass --drafter /path/to/dir") from exc


def drafter_digest(directory: Path) -> str:
    """SHA-256 over config.json and every *.safetensors file (names and bytes): the drafter's identity."""
    h = hashlib.sha256()
    for p in [directory / "config.json", *sorted(directory.glob("*.safetensors"))]:
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def read_hf_config(directory: Path) -> dict:
    """config.json of a transformers DFlash drafter, as data (checked to be one)."""
    try:
        doc = json.loads((directory / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ArtifactError(f"{directory / 'config.json'} is not readable JSON ({exc}): re-export the drafter") from exc
    if not isinstance(doc, dict) or doc.get("model_type") != MODEL_TYPE:
        found = doc.get("model_type") if isinstance(doc, dict) else type(doc).__name__
        raise BadInputError(f"--drafter {directory}: config.json has model_type {found!r}, not {MODEL_TYPE!r} "
                            "(transformers' DFlash drafter): pass a DFlash drafter checkpoint")
    return doc


def drafter_config_from_hf(doc: dict, vocab_size: int):
    """Our DrafterConfig for a transformers DFlash drafter config (refusing what our drafter cannot run)."""
    from ..runtime.drafter import DrafterConfig

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
                         attn_head_dim=None if hd == H // nh else hd)


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

    from ..runtime.drafter import DFlashDrafter

    doc = read_hf_config(directory)
    check_compatible(doc, rt, identity)
    dcfg = drafter_config_from_hf(doc, rt.vocab_size)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ArtifactError(f"--drafter {directory}: no *.safetensors weights (the lab never loads pickled .bin "
                            "weights): re-save the drafter with safetensors")
    sd: dict[str, Any] = {}
    try:
        for f in files:
            sd.update(load_file(str(f)))
    except (SafetensorError, OSError) as exc:
        raise ArtifactError(f"--drafter {directory}: the weights are unreadable ({exc}): re-export or "
                            "re-download the drafter") from exc
    drafter = DFlashDrafter(dcfg)
    ours = from_hf_state_dict(sd)
    missing = sorted(set(drafter.state_dict()) - set(ours))
    if missing:
        raise ArtifactError(f"--drafter {directory}: weights {missing[:4]} are missing: the checkpoint is "
                            "incomplete; re-export or re-download it")
    try:
        drafter.load_state_dict({k: v.float() for k, v in ours.items()}, strict=True)
    except RuntimeError as exc:
        raise ArtifactError(f"--drafter {directory}: a weight has the wrong shape for its config.json "
                            f"({str(exc).splitlines()[-1].strip()[:200]}): the checkpoint is inconsistent") from exc
    return drafter.to(torch.float32).eval()
