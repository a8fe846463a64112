"""Verified artifacts loaded for one runtime: what every method reads, next to the artifact store.

`load_prepared` verifies the manifest against the runtime's target and loads the drafter; `Prepared`
checks that the files a method needs are listed, and loads and caches each artifact once (proposers
are rebuilt per run during calibration). Every tensor artifact is safetensors (`artifacts.tensor_bytes`):
loading a home never unpickles anything. A home prepared with an imported transformers-format drafter
(`--drafter`) lives beside the target's own artifacts, keyed by the drafter's content hash too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ArtifactError
from ..runtime.drafter import DFlashDrafter, DrafterConfig
from ..runtime.kernels import apply_kernels, tune
from ..store.artifacts import artifact_dir, load_tensor_file, read_manifest, target_identity
from .drafter_format import drafter_digest, resolve_drafter_source

DRAFTER_FILE = "drafter.safetensors"


@dataclass
class Prepared:
    """Verified artifacts loaded for one runtime (drafter on the runtime's device and dtype)."""

    directory: Path
    manifest: dict
    drafter: Any
    files: dict = field(default_factory=dict)  # cache of loaded artifacts, by key

    def load_json(self, name: str) -> Any:
        return json.loads((self.directory / name).read_text("utf-8"))

    def load_tensors(self, name: str) -> Any:
        """A tensor artifact (safetensors + JSON skeleton), as the nested data its fitter wrote."""
        return load_tensor_file(self.directory / name)

    load_torch = load_tensors  # the name callers used when artifacts were torch.save files

    def require(self, names: tuple[str, ...], who: str = "this method") -> None:
        """Refuse when the manifest lacks a file `who` needs (names the prepare to run)."""
        files = self.manifest.get("files", {})
        target = self.manifest.get("target", {}).get("name", "<target>")
        for name in names:
            if name not in files:
                raise ArtifactError(
                    f"{self.directory / 'manifest.json'} lacks {name!r}, which {who} needs: run "
                    f"`python -m dflash_core prepare --target {target} --refresh` (it builds {name})")

    def cached(self, key: str, loader: Callable[[], Any]) -> Any:
        """`loader()` once per Prepared, cached under `key`."""
        if key not in self.files:
            self.files[key] = loader()
        return self.files[key]

    def module(self, name: str, cls) -> Any:
        """An nn.Module saved as {"config", "state_dict"} in artifact `name`, built once, in eval mode."""
        def load():
            self.require((name,))
            blob = self.load_tensors(name)
            mod = cls(**blob["config"])
            mod.load_state_dict(blob["state_dict"])
            return mod.eval()

        return self.cached(name + "#module", load)


def drafter_source_digest(drafter: str | None) -> str | None:
    """The content hash of an imported drafter (`--drafter DIR_OR_HUB_ID`), None for the trained one."""
    if not drafter:
        return None
    return drafter_digest(resolve_drafter_source(drafter))


def prepared_dir(identity: dict, home=None, drafter_sha256: str | None = None) -> Path:
    """The artifact directory: the target's own, or (imported drafter) `<target key>--drafter-<hash16>`."""
    d = artifact_dir(identity, home)
    return d if drafter_sha256 is None else d.with_name(f"{d.name}--drafter-{drafter_sha256[:16]}")


def drafter_dtype(target_dtype):
    """The dtype the drafter runs in beside a target of `target_dtype`: the target's for float32 / float64, else
    float32 (a half-precision drafter loses more acceptance than it saves time at the lab's sizes). The
    `dflash_transformers` peer's drafter uses this too, so that row compares implementations, not precisions."""
    import torch

    return target_dtype if target_dtype in (torch.float32, torch.float64) else torch.float32


def load_prepared(rt, *, home=None, required: tuple[str, ...] = (), drafter: str | None = None) -> Prepared:
    """Verify the manifest against the runtime's target and load the drafter onto its device/dtype.

    `drafter`: the transformers-format drafter the home was prepared with (`prepare(..., drafter=)`)."""
    import torch

    ident = target_identity(rt)
    d = prepared_dir(ident, home, drafter_source_digest(drafter))
    doc = read_manifest(d, ident, required=(DRAFTER_FILE, *required))
    blob = load_tensor_file(d / DRAFTER_FILE)
    try:
        drafter = DFlashDrafter(DrafterConfig.from_dict(blob["config"]))
        drafter.load_state_dict(blob["state_dict"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ArtifactError(f"{d / DRAFTER_FILE} is not a drafter artifact ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:160] if str(exc) else ''}): run `python -m dflash_core "
                            f"prepare --target {ident.get('name', '<target>')} --refresh`") from exc
    dt = drafter_dtype(rt.dtype)
    drafter = drafter.to(device=rt.device, dtype=dt).eval()
    kernels = getattr(rt, "kernels", "eager")
    if kernels == "tuned" and dt == torch.float32:
        # a table probed on the drafter's own weights: they are small enough to sit in cache, the target's stream
        rt.info["drafter_kernel_layouts"] = tune(drafter)
    elif kernels != "eager" and dt == torch.float32:
        apply_kernels(drafter, kernels)  # the drafter runs on the same execution path as the target
    return Prepared(directory=d, manifest=doc, drafter=drafter)
