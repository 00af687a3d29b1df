"""The design lives in the repository (docs/design.md): no file cites a design document outside it, and every
citation of a section of docs/design.md names a section it has."""
from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DESIGN = REPO / "docs" / "design.md"
SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist", ".pytest_cache"}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml", ".sh", ".ps1", ".bat", ".cfg", ".txt", ".json", ".desktop", ""}
# Built from parts, so this file does not cite them itself.
OUTSIDE = ("../" + "shared", "/work/" + "shared", "DESIGN" + ".md")
CITED_SECTION = re.compile(r"docs/design\.md[^\"\n]{0,12}?\"([^\"\n]+)\"")


def _text_files():
    for path in REPO.rglob("*"):
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in path.relative_to(REPO).parts):
            continue
        if path.is_file() and path.suffix in TEXT_SUFFIXES and path.stat().st_size < 2_000_000:
            try:
                yield path, path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue


def test_no_file_cites_a_design_document_outside_the_repository():
    found = [f"{path.relative_to(REPO)}:{n}: {line.strip()}" for path, text in _text_files()
             for n, line in enumerate(text.splitlines(), 1) if any(o in line for o in OUTSIDE)]
    assert not found, "cite docs/design.md instead:\n" + "\n".join(found)


def test_cited_sections_of_the_design_exist():
    headings = {h.strip().lower() for h in re.findall(r"^#+\s*(?:\d+\.\s*)?(.+)$", DESIGN.read_text(encoding="utf-8"),
                                                     re.M)}
    here = Path(__file__).resolve()
    cited = {(m.group(1), path.relative_to(REPO)) for path, text in _text_files() if path not in (DESIGN, here)
             for m in CITED_SECTION.finditer(text)}
    assert cited, "the code cites sections of docs/design.md by name"
    missing = sorted(f"{where}: \"{name}\"" for name, where in cited if name.lower() not in headings)
    assert not missing, "docs/design.md has no section of these names:\n" + "\n".join(missing)
