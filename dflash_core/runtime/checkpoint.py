"""Finding and checking a target checkpoint before anything is allocated: the `mini` alias, a local directory
or a hub snapshot (config, weights and tokenizer files only), the bounds its config.json must respect, the
mini target's metadata, then the model and tokenizer through `from_pretrained` with `trust_remote_code=False`.
`target.load_target` builds the runtime on what this returns."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .. import DEFAULT_HUB_TARGET
from ..errors import TargetNotFoundError
from ..safeio import check_regular_file, read_json
from ..store.artifacts import META_FILE, mini_target_dir

HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "vocab.txt", "special_tokens_map.json")


def resolve_target_source(target: str, home: str | Path | None = None) -> tuple[str, str]:
    """Return (kind, location): kind is 'mini', 'local' or 'hub'. Unknown names raise with the options."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if not isinstance(target, str) or not target.strip():
        raise TargetNotFoundError("empty target name: use 'mini', a local checkpoint directory, or a hub id "
                                  f"such as {DEFAULT_HUB_TARGET}")
    if target == "mini":
        return "mini", str(mini_target_dir(home))
    p = Path(target).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise TargetNotFoundError(f"target directory {p} has no config.json: point --target at a directory "
                                      "written by save_pretrained()")
        return "local", str(p)
    unknown = (f"unknown target {target!r}: not 'mini', not an existing directory, and not a hub id of the form "
               f"owner/name (e.g. {DEFAULT_HUB_TARGET})")
    # A bare word is far likelier a typo of 'mini' or a missing folder than a legacy un-namespaced hub alias.
    if target.startswith((".", "/", "~")) or target.count("/") != 1:
        raise TargetNotFoundError(unknown)
    try:
        validate_repo_id(target)  # the hub's own rule (dots, dashes, lengths), not a guess from file suffixes
    except HFValidationError as exc:
        raise TargetNotFoundError(f"{unknown}; {exc}") from exc
    return "hub", target


def _hub_snapshot(repo_id: str, revision: str | None) -> Path:
    """The local snapshot folder of a hub id (downloaded when online, from the cache when HF_HUB_OFFLINE=1)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS))
    except Exception as exc:  # any hub failure (offline, not cached, unknown repo or revision, HTTP) means the same
        at = f" at revision {revision!r}" if revision else ""
        raise TargetNotFoundError(
            f"could not load {repo_id!r}{at} from the Hugging Face hub or its local cache ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:200] if str(exc) else ''}). Without hub access, download the checkpoint "
            "elsewhere, copy the directory here and pass --target /path/to/checkpoint (any directory written by "
            "save_pretrained with config.json and weights).") from exc


def _checkpoint_meta(where: Path, error) -> dict:
    """Facts the checkpoint states about itself: the lab's mini target (and any copy of it) carries
    mini_target_meta.json, whose prompt family is 'code' (its corpus is Python source)."""
    path = where / META_FILE
    if not path.exists():
        return {"family": None, "mini_corpus_files": None, "mini_seed": None}
    fix = "restore it or delete the file"
    meta = read_json(path, "checkpoint metadata", error, fix, max_bytes=16 << 20)
    try:
        files = int(meta.get("config", {}).get("corpus_files", 400))
        if not 1 <= files <= 100_000:
            raise ValueError(f"corpus_files {files} outside 1..100000")
        seed = meta.get("config", {}).get("seed")
        if seed is not None and not (isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 1 << 63):
            raise ValueError(f"seed {str(seed)[:40]!r} is not an integer in 0..2**63-1")
        return {"family": str(meta.get("prompt_family", "code"))[:64], "mini_corpus_files": files, "mini_seed": seed}
    except (ValueError, AttributeError, TypeError, OverflowError) as exc:
        raise error(f"{path} is not valid checkpoint metadata ({exc}): {fix}") from exc


# Bounds on a target's config, checked before `from_pretrained` allocates anything (a config.json asking for
# 100,000 layers allocated until the machine ran out of memory). LFM2.5-350M: 16 layers, hidden 1024, vocab 65536.
TARGET_LIMITS = {"num_hidden_layers": 256, "hidden_size": 65536, "intermediate_size": 262144,
                 "vocab_size": 1 << 21, "num_attention_heads": 1024, "num_key_value_heads": 1024,
                 "max_position_embeddings": 1 << 24}
MAX_TARGET_PARAMETERS = 10_000_000_000
CHECKPOINT_SUFFIXES = (".json", ".safetensors", ".model", ".txt", ".jinja", ".tiktoken")


SHARD_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")


def check_shards(where: Path, index: Path, error, fix: str) -> None:
    """Every shard a `*.index.json` names is a plain file name in the checkpoint folder and a regular file: a name
    such as ../../x or /dev/zero sent the loader outside the folder (a FIFO hung `run`, /dev/zero took 10 GB)."""
    doc = read_json(index, "checkpoint shard index", error, fix, max_bytes=64 << 20)
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(wmap, dict):
        raise error(f"{index} has no weight_map object: {fix}")
    for name in sorted({v if isinstance(v, str) else repr(v) for v in wmap.values()}):
        if not SHARD_NAME.match(name) or name in (".", ".."):
            raise error(f"{index} names the shard {name[:80]!r}, not a file name inside {where}: {fix}")
        check_regular_file(where / name, "checkpoint shard", error, fix)


def check_checkpoint(where: Path, error) -> dict:
    """What can be checked of a checkpoint directory without loading it: every file transformers may open is a
    regular file (a FIFO or a link to /dev/zero hangs the loader), config.json is bounded JSON, asks for no code
    of its own (`auto_map`: refused, as the README says, whatever the weights) and for a model of sane size."""
    fix = f"restore the checkpoint in {where} (files must be plain files)"
    for p in sorted(where.iterdir()):
        if p.name.endswith(CHECKPOINT_SUFFIXES):
            check_regular_file(p, "checkpoint file", error, fix)
    for index in sorted(where.glob("*.index.json")):
        check_shards(where, index, error, fix)
    cfg = read_json(where / "config.json", "checkpoint config", error, fix, max_bytes=16 << 20)
    if not isinstance(cfg, dict):
        raise error(f"{where / 'config.json'} is not a JSON object: {fix}")
    if "auto_map" in cfg:
        raise error(f"the checkpoint in {where} asks to run its own Python code (auto_map in config.json); the lab "
                    "never runs a checkpoint's code (trust_remote_code=False): use a checkpoint of an architecture "
                    "transformers ships (e.g. LFM2)")
    for k, hi in TARGET_LIMITS.items():
        v = cfg.get(k)
        if v is not None and not (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= hi):
            raise error(f"{where / 'config.json'}: {k} is {str(v)[:40]!r}, not an integer in 1..{hi}: {fix}")
    H, L = cfg.get("hidden_size") or 0, cfg.get("num_hidden_layers") or 0
    params = (cfg.get("vocab_size") or 0) * H + L * (4 * H * H + 3 * H * (cfg.get("intermediate_size") or 4 * H))
    if params > MAX_TARGET_PARAMETERS:
        raise error(f"{where / 'config.json'} describes about {params:.3g} parameters, more than the "
                    f"{MAX_TARGET_PARAMETERS:.0e} this lab loads: {fix}")
    return cfg


def _load_model(where: Path, error):
    import torch
    from transformers import AutoModelForCausalLM

    check_checkpoint(where, error)
    try:
        # Loaded in float32 first: the artifact identity is a property of the checkpoint, so it is hashed at
        # one precision whatever dtype the run uses (prepare works in float32; a float16/bfloat16 run must
        # find the same artifacts). Then cast and moved.
        return AutoModelForCausalLM.from_pretrained(str(where), dtype=torch.float32, trust_remote_code=False,
                                                    local_files_only=True)
    except Exception as exc:  # a user-supplied checkpoint can fail in many ways; each becomes one clear error
        msg = str(exc).splitlines()[0][:240] if str(exc) else ""
        if "trust_remote_code" in str(exc) or "auto_map" in _read_text(where / "config.json"):
            raise error(f"the checkpoint in {where} asks to run its own Python code (auto_map in config.json); "
                        "the lab never runs a checkpoint's code (trust_remote_code=False): use a checkpoint of an "
                        "architecture transformers ships (e.g. LFM2)") from exc
        weights = sorted(p.name for p in where.glob("*.safetensors"))
        if type(exc).__name__ == "SafetensorError":
            raise error(f"the weights {', '.join(weights) or '(none)'} in {where} are unreadable (truncated or "
                        f"corrupt: {msg}): re-save or re-download the checkpoint") from exc
        raise error(f"could not load the checkpoint in {where} ({type(exc).__name__}: {msg})") from exc


def _read_text(path: Path) -> str:
    try:
        return path.read_text("utf-8")
    except (OSError, ValueError):
        return ""


def _load_tokenizer(where: Path, error):
    """The checkpoint's tokenizer, or None when it ships none (a weights-only save). A tokenizer that is
    present but broken is an error naming the file, not a silent 'no tokenizer'."""
    from transformers import AutoTokenizer

    present = [f for f in TOKENIZER_FILES if (where / f).is_file()]
    if not present:
        return None
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if name in present:
            try:
                json.loads((where / name).read_text("utf-8"))
            except (OSError, ValueError) as exc:
                raise error(f"{where / name} is not valid JSON ({exc}): the tokenizer is corrupt; restore the "
                            "file (for the mini target: `python -m dflash_core prepare --target mini --refresh`)"
                            ) from exc
    try:
        return AutoTokenizer.from_pretrained(str(where), trust_remote_code=False, local_files_only=True)
    except Exception as exc:  # tokenizers raises plain Exception for a malformed file
        raise error(f"the tokenizer in {where} ({', '.join(present)}) could not be loaded ({type(exc).__name__}: "
                    f"{str(exc).splitlines()[0][:200] if str(exc) else ''}): restore those files") from exc
