"""Every document the code and the README cite exists in the repository, every section of docs/spec.md that a
docstring cites by number is there, and the README's results are the shipped runs'."""

import gzip
import json
import re
from pathlib import Path

import pytest
import sacrebleu

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


def test_readme_results_are_the_shipped_runs():
    """Each row of the README's Multi30k table is its model's chosen grid run and final run as the runner recorded
    them (benchmarks/results/): the learning rate and warm-up, the short-budget loss and BLEU, the updates and how the
    run stopped, the valid loss, BLEU and chrF; the shipped test hypotheses score that BLEU."""
    with gzip.open(ROOT / "data/multi30k/test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        references = f.read().splitlines()
    grid = json.loads((ROOT / "benchmarks/results/cpu_multi30k_grid_2026-11-25/grid.json").read_text())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    folder = "cpu_multi30k_final_2026-11-28"
    finals = json.loads((ROOT / "benchmarks/results" / folder / "results.json").read_text())
    assert [r["model"] for r in finals] == ["talk", "dynamic_conv", "lightconv", "marian"]
    for name, model in [("TaLK (`talk`)", "talk"), ("DynamicConv", "dynamic_conv"), ("LightConv", "lightconv"),
                        ("Transformer (`MarianMTModel`)", "marian")]:
        final = next(r for r in finals if r["model"] == model)
        short = min((r for r in grid if r["model"] == model), key=lambda r: r["valid_loss"])
        assert (short["learning_rate"], short["warmup_steps"]) == (final["learning_rate"], final["warmup_steps"])
        learning_rate = f"{final['learning_rate']:.0e}".replace("e-0", "e-")  # 2e-3
        row = (f"| {name} | {learning_rate}, {final['warmup_steps']} | {short['valid_loss']:.3f}, "
               f"{short['test_bleu']:.2f} | {final['steps']:,} ({'patience' if final['stopped_early'] else 'cap'}) | "
               f"{final['valid_loss']:.3f} | {final['test_bleu']:.2f} | {final['test_chrf']:.2f} |")
        assert row in readme, row
        hypotheses = ROOT / "benchmarks/results" / folder / f"{model}.test_hypotheses.txt"
        assert sacrebleu.corpus_bleu(hypotheses.read_text().splitlines(), [references]).score == \
            pytest.approx(final["test_bleu"], abs=1e-9)  # the shipped outputs are the scored ones
