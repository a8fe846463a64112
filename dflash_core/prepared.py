"""Verified artifacts loaded for one runtime: what every method reads, next to the artifact store.

`load_prepared` verifies the manifest against the runtime's target and loads the drafter; `Prepared`
checks that the files a method needs are listed, and loads and caches each artifact once (proposers
are rebuilt per run during calibration).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .artifacts import artifact_dir, load_torch_file, read_manifest, target_identity
from .errors import ArtifactError

DRAFTER_FILE = "drafter.pt"


@dataclass
class Prepared:
    """Verified artifacts loaded for one runtime (drafter on the runtime's device and dtype)."""

    directory: Path
    manifest: dict
    drafter: Any
    files: dict = field(default_factory=dict)  # cache of loaded artifacts, by key

    def load_json(self, name: str) -> Any:
        return json.loads((self.directory / name).read_text("utf-8"))

    def load_torch(self, name: str) -> Any:
        return load_torch_file(self.directory / name)

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
            blob = self.load_torch(name)
            mod = cls(**blob["config"])
            mod.load_state_dict(blob["state_dict"])
            return mod.eval()

        return self.cached(name + "#module", load)


def load_prepared(rt, *, home=None, required: tuple[str, ...] = ()) -> Prepared:
    """Verify the manifest against the runtime's target and load the drafter onto its device/dtype."""
    import torch

    from .drafter import DFlashDrafter, DrafterConfig

    ident = target_identity(rt)
    d = artifact_dir(ident, home)
    doc = read_manifest(d, ident, required=(DRAFTER_FILE, *required))
    blob = load_torch_file(d / DRAFTER_FILE)
    dcfg = DrafterConfig.from_dict(blob["config"])
    drafter = DFlashDrafter(dcfg)
    drafter.load_state_dict(blob["state_dict"])
    dt = rt.dtype if rt.dtype in (torch.float32, torch.float64) else torch.float32
    drafter = drafter.to(device=rt.device, dtype=dt).eval()
    if getattr(rt, "kernels", "eager") != "eager" and dt == torch.float32:
        from .kernels import apply_kernels

        apply_kernels(drafter, rt.kernels)  # the drafter runs on the same execution path as the target
    return Prepared(directory=d, manifest=doc, drafter=drafter)
