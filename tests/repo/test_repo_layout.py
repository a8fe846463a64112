"""The repository's layout rules (issue 68): every study is a well-formed folder of studies/ with a row in the
ledger, scripts/ holds only the tools its README lists, each saying when to run it, no test reaches a script by
editing sys.path, and docs/ carries no dated study section. Pure file reads: no torch, no model."""

from __future__ import annotations

import ast
import datetime as dt
import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STUDIES = REPO / "studies"
FIELDS = ("Question", "Command", "Commit", "Model hash", "Machine", "Result", "Verdict")
STUDY_NAME = re.compile(r"(\d{4}-\d{2}-\d{2})-[a-z0-9][a-z0-9._-]*")
HARNESSES = {"drafter_lab"}  # live research code: a package with its own README, not a dated study
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def study_folders() -> list[Path]:
    return sorted(p for p in STUDIES.iterdir() if p.is_dir() and p.name not in HARNESSES | {"__pycache__"})


def fields(readme: str) -> dict[str, str]:
    """Field name -> its text, for lines like `- **Question:** text` (also `**Question:** text`, `Question: text`,
    or a `## Question` heading with the text below it, the forms other writers use)."""
    names = "|".join(re.escape(f) for f in FIELDS)
    line = re.compile(rf"^\s*(?:[-*]\s+)?(?:#+\s*)?(?:\*\*)?({names})(?:\*\*)?(?:\s*:\s*(?:\*\*)?\s*(.*)|\s*$)", re.I)
    found, current = {}, None
    for raw in readme.splitlines():
        m = line.match(raw)
        if m and m.group(1).lower() not in {k.lower() for k in found}:
            current = next(f for f in FIELDS if f.lower() == m.group(1).lower())
            found[current] = (m.group(2) or "").strip()
        elif current and not found[current] and raw.strip() and not raw.startswith("#"):
            found[current] = raw.strip()  # a heading-style field: its text is the next line
        elif raw.startswith("#"):
            current = None
    return found


def test_there_are_studies_and_the_format_page():
    assert (STUDIES / "README.md").is_file()
    assert len(study_folders()) >= 30, "the studies moved out of docs/ are missing"


@pytest.mark.parametrize("folder", study_folders(), ids=lambda p: p.name)
def test_every_study_folder_is_well_formed(folder):
    """`<date>-<name>/` with a real date, a README holding the seven fields with text, Python that compiles and
    JSON that parses."""
    m = STUDY_NAME.fullmatch(folder.name)
    assert m, f"studies/{folder.name}: name it <YYYY-MM-DD>-<short-name> (studies/README.md)"
    dt.date.fromisoformat(m.group(1))
    readme = folder / "README.md"
    assert readme.is_file(), f"studies/{folder.name} has no README.md"
    got = fields(readme.read_text(encoding="utf-8"))
    missing = [f for f in FIELDS if not got.get(f)]
    assert not missing, f"studies/{folder.name}/README.md lacks the field(s) {missing} (studies/README.md)"
    for py in folder.rglob("*.py"):
        compile(py.read_text(encoding="utf-8"), str(py), "exec")
    for js in folder.rglob("*.json"):
        import json

        json.loads(js.read_text(encoding="utf-8"))


def test_the_drafter_harness_imports_and_says_what_it_is():
    lab = STUDIES / "drafter_lab"
    assert (lab / "README.md").is_file()
    for py in sorted(lab.glob("*.py")):
        mod = importlib.import_module(f"studies.drafter_lab.{py.stem}")
        assert (mod.__doc__ or "").strip(), f"{py.relative_to(REPO)} has no docstring"


def test_the_ledger_and_the_study_folders_agree():
    """Every study folder has a row in docs/results.md, and every row links a folder that exists."""
    ledger = (REPO / "docs/results.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\(\.\./studies/([^/)]+)/?\)", ledger))
    names = {p.name for p in study_folders()}
    assert not linked - names, f"docs/results.md links folders that do not exist: {sorted(linked - names)}"
    assert not names - linked, f"add a row to docs/results.md for each of: {sorted(names - linked)}"


def _tables(text: str) -> list[list[list[str]]]:
    """The markdown tables of `text`, each a list of rows of cells (header and rule rows dropped)."""
    tables, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
        elif rows:
            tables.append([r for r in rows[2:]])
            rows = []
    return tables


def _header(path: Path) -> str:
    """A tool's docstring (Python) or its leading comment lines (shell, JavaScript)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return ast.get_docstring(ast.parse(text)) or ""
    lines = text.splitlines()
    lines = lines[1:] if lines and lines[0].startswith("#!") else lines
    head = []
    for ln in lines:
        if not ln.startswith(("#", "//")):
            break
        head.append(ln)
    return "\n".join(head)


def test_scripts_holds_only_the_listed_tools_each_saying_when_to_run_it():
    tools, pending = (_tables((REPO / "scripts/README.md").read_text(encoding="utf-8")) + [[], []])[:2]
    listed = {row[0].strip("`") for row in tools}
    pending_names = {row[0].strip("`") for row in pending}
    present = {p.name for p in (REPO / "scripts").iterdir() if p.name not in {"README.md", "__pycache__"}}
    assert present == listed | pending_names, (
        f"scripts/ and scripts/README.md differ: unlisted {sorted(present - listed - pending_names)}, "
        f"listed but absent {sorted((listed | pending_names) - present)} (a one-off measurement is a study)")
    for name in sorted(listed):
        assert "when to run:" in _header(REPO / "scripts" / name).lower(), f"scripts/{name}: say when to run it"


def test_no_test_reaches_a_script_or_a_study_by_editing_sys_path():
    offenders = []
    for py in sorted((REPO / "tests").rglob("*.py")):
        for n, line in enumerate(py.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"sys\.path\.(insert|append)", line) and re.search(r"scripts|studies", line):
                offenders.append(f"{py.relative_to(REPO)}:{n}")
    assert not offenders, f"load a script with tests.helpers.load_file instead: {offenders}"


def test_docs_carry_no_dated_study_section():
    """A reference page's headings carry no date: a dated measurement is a study folder and a ledger row."""
    dated = [f"{p.name}: {ln}" for p in sorted((REPO / "docs").glob("*.md"))
             for ln in p.read_text(encoding="utf-8").splitlines() if ln.startswith("#") and DATED.search(ln)]
    assert not dated, f"move these sections to studies/ (studies/README.md): {dated}"
