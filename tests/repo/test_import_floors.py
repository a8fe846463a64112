"""The package's floors (docs/design.md, "Floors"): every module of dflash_core imports only modules on its own
floor or below, and no import circle exists. The graph is read with `ast` from the source, module-level and
function-level imports alike, so a circle cannot hide inside a function body.

An import that stays inside a function must be listed (`LAZY`, `LAZY_LAB`) with why: torch, transformers and the
other heavy libraries load only when a command needs them, so `python -m dflash_core --help` and the root conftest
stay fast and torch-free (`test_the_cli_and_the_conftest_plugin_import_without_torch`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "dflash_core"

# floor of each module, by the longest matching prefix; a module not matched is refused (add it to the table)
FLOORS = {
    "dflash_core": 1,  # the package face: __version__, DEFAULT_HUB_TARGET
    "dflash_core.errors": 1,
    "dflash_core.progress": 1,
    "dflash_core.quiet": 1,
    "dflash_core.options": 2,
    "dflash_core.safeio": 2,
    "dflash_core.savedruns": 2,  # the --calibration-from gatekeeper's reader: options.py checks the knob with it
    "dflash_core.stats": 3,
    "dflash_core.store": 3,
    "dflash_core.runtime": 4,
    "dflash_core.methods": 5,
    "dflash_core.prepare": 6,
    "dflash_core.testing": 6,  # test targets, built with prepare
    "dflash_core.bench": 7,
    "dflash_core.report": 8,
    "dflash_core.__main__": 8,
}

# Third-party libraries a module may import inside a function body (-> why): their import time is paid only by the
# command that needs them, so `python -m dflash_core --help` and the root conftest stay fast and torch-free.
LAZY = {
    "torch": "about 1.5 s: the CLI and conftest import the package without it",
    "transformers": "seconds: only a command that loads a model pays for it",
    "safetensors": "its torch half pulls torch in",
    "tokenizers": "only when the mini target's tokenizer is trained",
    "huggingface_hub": "only when a hub id or a drafter export is resolved",
    "datasets": "only for --train-data with a dataset",
    "scipy": "about 0.8 s: only when a statistic needs it",
    "numpy": "only where a run records library versions",
    "tqdm": "a progress bar only on a terminal",
}
# Lab modules imported inside a function (importer -> imported -> why): each pulls torch or scipy in, and the
# importer is imported by every `python -m dflash_core` call or every pytest run (the root conftest's plugin).
_CLI_TORCH = "pulls torch in: only the command that runs it pays, --help and --version stay fast"
LAZY_LAB = {
    "dflash_core.__main__": {m: _CLI_TORCH for m in (
        "dflash_core.methods", "dflash_core.methods.runner", "dflash_core.prepare.pipeline",
        "dflash_core.prepare.prepared", "dflash_core.prepare.drafter_format", "dflash_core.bench.reuse")}
    | {"dflash_core.report.__main__": "scipy (~0.8 s), paid only by `report`, `compare` and `gate`",
       "dflash_core.report.schema": "jsonschema (~0.1 s): only `export-drafter` and `run` read a report"},
    "dflash_core.runtime.kernels": {"dflash_core.runtime.layouts": "pulls torch in (TunedLinear is an nn.Module), "
                                    "and runtime.target, imported by every CLI call, imports kernels"},
    "dflash_core.report.plugin": {m: "scipy (~0.8 s), paid only when a benchmark session writes its report"
                                  for m in ("dflash_core.report.build", "dflash_core.report.write",
                                            "dflash_core.report.ranking")},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def floor_of(mod: str) -> int | None:
    best = None
    for prefix, floor in FLOORS.items():
        if (mod == prefix or mod.startswith(prefix + ".")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, floor)
    return best[1] if best else None


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for every import statement of one file; a lab module's
    `from X import name` counts as importing X.name when that is a module of the package."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    tree = ast.parse(path.read_text("utf-8"))
    out = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                out.extend((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")[: len(package.split(".")) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                for a in child.names:
                    sub = f"{target}.{a.name}"
                    out.append((sub if _is_module(sub) else target, child.lineno, in_function))
            visit(child, inner)

    visit(tree, False)
    return out


def _is_module(mod: str) -> bool:
    if not mod.startswith("dflash_core"):
        return False
    rel = Path(*mod.split(".")[1:]) if "." in mod else Path()
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()


def graph() -> dict[str, list[tuple[str, int, bool]]]:
    return {module_name(p): imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def climbs(g) -> list[str]:
    bad = []
    for mod, edges in g.items():
        here = floor_of(mod)
        if here is None:
            bad.append(f"{mod}: no floor in FLOORS (give it one)")
            continue
        for target, line, _ in edges:
            if target.startswith("dflash_core"):
                there = floor_of(target)
                if there is not None and there > here:
                    bad.append(f"{mod}:{line} imports {target} (floor {there} above its floor {here})")
    return bad


def lazy_lab_or_unlisted(g) -> list[str]:
    bad = []
    for mod, edges in g.items():
        for target, line, in_function in edges:
            if not in_function:
                continue
            root = target.split(".")[0]
            allowed = target in LAZY_LAB.get(mod, {}) if root == "dflash_core" else root in LAZY
            if not allowed:
                bad.append(f"{mod}:{line} imports {target} inside a function (move it to the top, or list it in "
                           "LAZY / LAZY_LAB with why)")
    return bad


def circles(g) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), plus modules that import themselves.
    A package's __init__ that its own submodules import counts like any other module."""
    nodes = {m: sorted({t for t, _, _ in edges if t in g and t != m}) for m, edges in g.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in nodes[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in nodes:
        if v not in index:
            strong(v)
    return found


def test_no_import_climbs_a_floor():
    assert climbs(graph()) == []


def test_no_import_circle():
    assert circles(graph()) == []


def test_lab_imports_sit_at_the_top_and_lazy_ones_are_listed():
    assert lazy_lab_or_unlisted(graph()) == []


def test_the_checks_see_a_climb_a_circle_and_a_hidden_import():
    """The rules on a made-up graph: a store module importing bench climbs; two runtime modules importing each
    other inside functions are a circle and two hidden lab imports."""
    g = {"dflash_core.store.x": [("dflash_core.bench.y", 3, False)],
         "dflash_core.bench.y": [],
         "dflash_core.runtime.a": [("dflash_core.runtime.b", 5, True)],
         "dflash_core.runtime.b": [("dflash_core.runtime.a", 7, True), ("torch", 8, True), ("yaml", 9, True)]}
    assert climbs(g) == ["dflash_core.store.x:3 imports dflash_core.bench.y (floor 7 above its floor 3)"]
    assert circles(g) == [["dflash_core.runtime.a", "dflash_core.runtime.b"]]
    assert [line.split(" ")[0] for line in lazy_lab_or_unlisted(g)] == [
        "dflash_core.runtime.a:5", "dflash_core.runtime.b:7", "dflash_core.runtime.b:9"]


def test_the_cli_and_the_conftest_plugin_import_without_torch():
    """What every `python -m dflash_core` call and every pytest run imports stays free of torch and scipy."""
    code = ("import sys; import dflash_core.__main__, dflash_core.report.plugin, dflash_core.options; "
            "print(sorted(m for m in ('torch', 'transformers', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    assert out.strip() == "[]"
