"""Every document the code and the README cite exists in the repository, and every section of docs/spec.md that a
docstring cites by number is there."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [*ROOT.glob("talk_hf/**/*.py"), *ROOT.glob("scripts/*.py"), *ROOT.glob("benchmarks/*.py"),
           *ROOT.glob("tests/*.py"), *ROOT.glob("tests/models/*.py"), *ROOT.glob("tests/training/*.py"),
           ROOT / "README.md", *ROOT.glob("docs/*.md")]


def cited(pattern):
    for path in SOURCES:
        for match in re.finditer(pattern, path.read_text(encoding="utf-8")):
            yield path.relative_to(ROOT), match


def test_cited_documents_exist():
    found = list(cited(r"(?<![\w/.])(docs/[\w./-]+\.md|benchmarks/[\w./-]+)"))
    missing = [(str(p), m.group(0)) for p, m in found if not (ROOT / m.group(1).rstrip(".")).exists()]
    assert len(found) > 10 and missing == []
    readme_links = re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert readme_links and all((ROOT / link).exists() for link in readme_links), readme_links


def test_cited_spec_sections_exist():
    spec = (ROOT / "docs" / "spec.md").read_text(encoding="utf-8")
    sections = set(re.findall(r"^\*\*([A-Z]\.\d+) ", spec, re.M)) | set(re.findall(r"^## ([A-Z])\. ", spec, re.M))
    citations = {m.group(1) for _, m in cited(r"docs/spec\.md §([A-Z](?:\.\d+)?)")}
    citations |= {m.group(1) for _, m in cited(r"docs/spec\.md §[A-Z]\.\d+-([A-Z]\.\d+)")}
    assert citations and citations <= sections, citations - sections


def test_readme_is_a_guide_within_its_size():
    assert len((ROOT / "README.md").read_bytes()) <= 12 * 1024
