"""A wheel of the package works outside the checkout: templates and metric modules as package data, no path into
the source tree; the source distribution holds what a build from it compiles."""

import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A tiny model trained one step, saved, given its model card and used through pipeline("translation").
USE = textwrap.dedent("""
    import os, sys, torch
    import talk_hf
    from transformers import pipeline
    from talk_hf import TalkConfig, TalkForConditionalGeneration, train_joint_bpe
    from talk_hf.training.corpora import load_wiki_zh_en
    from talk_hf.training.model_card import write_model_card

    assert talk_hf.__file__.startswith(sys.argv[1]), talk_hf.__file__  # the installed copy, not the checkout
    texts = ["ein Hund läuft im Park", "a dog runs in the park", "zwei Kinder spielen", "two children play"] * 8
    tokenizer = train_joint_bpe(texts, vocab_size=60, min_frequency=1)
    config = TalkConfig(vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_ffn_dim=16, decoder_ffn_dim=16, encoder_heads=2, decoder_heads=2,
                        decoder_attention_heads=2, encoder_max_offsets=[2], decoder_max_offsets=[2],
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                        decoder_start_token_id=tokenizer.eos_token_id)
    model = TalkForConditionalGeneration(config)
    batch = tokenizer(texts[:4:2], text_target=texts[1:4:2], return_tensors="pt", padding=True)
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100
    model(**batch).loss.backward()
    model.save_pretrained("model")
    tokenizer.save_pretrained("model")
    card = write_model_card("model", model, languages=["de", "en"], license="mit", datasets=["multi30k"],
                            metrics={"test_bleu": 1.0})
    assert "TaLK" in open(card).read()
    print(pipeline("translation", model="model", max_new_tokens=3)("ein Hund")[0]["translation_text"] is not None)
    import evaluate
    from talk_hf.metrics import DOCUMENT_BLEU
    assert DOCUMENT_BLEU.startswith(sys.argv[1])
    bleu = evaluate.load(DOCUMENT_BLEU).compute(predictions=[[texts[1]]], references=[[texts[1]]])["bleu"]
    print("document_bleu:", round(bleu))
    try:
        load_wiki_zh_en("dev")
    except FileNotFoundError as err:
        print("no bundled corpus:", "pass archive=" in str(err))
""")


def _copy_checkout(source):
    """The files of a clean clone (no build/ left by an earlier build) copied to ``source``."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                            check=True, capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    return sorted(name for name in listed if name and (ROOT / name).is_file())


def test_source_distribution_holds_every_kernel_source_and_no_tests(tmp_path):
    """The sdist (setuptools' build_meta, as `python -m build --sdist` runs it) holds every file under csrc/ (the
    headers and CUDA sources the compiler reads, not only the .cpp files ext_modules names), the build files and the
    licence; not the tests, which need the repository's fixtures."""
    source, dist = tmp_path / "source", tmp_path / "dist"
    files = _copy_checkout(source)
    build = "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
    result = subprocess.run([sys.executable, "-c", build, str(dist)], cwd=source, capture_output=True, text=True,
                            env={**os.environ, "TALK_HF_SKIP_BUILD": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    (sdist,) = dist.glob("talk_hf-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    kernel_sources = {name for name in files if name.startswith("csrc/")}
    assert kernel_sources and kernel_sources <= names, sorted(kernel_sources - names)
    assert {"setup.py", "pyproject.toml", "LICENSE", "README.md", "talk_hf/__init__.py"} <= names
    assert not any(name.startswith("tests/") for name in names)


def test_a_source_tree_without_its_extension_says_so(tmp_path):
    """Imported from a checkout whose extension is not built (the working directory shadows an installed package),
    talk_hf names that tree and how to build it, not an install option."""
    source = tmp_path / "source"
    _copy_checkout(source)
    packages = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(packages)}
    result = subprocess.run([sys.executable, "-S", "-c", "from talk_hf import _kernels; print(_kernels.load_error())"],
                            cwd=source, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"not built in the source tree talk_hf is imported from ({source / 'talk_hf'})" in result.stdout
    assert "build_ext --inplace" in result.stdout


def test_wheel_works_outside_the_checkout(tmp_path):
    """`pip wheel --no-build-isolation .` (TALK_HF_SKIP_BUILD=1: the pure-PyTorch ops, no compiler run) installed
    into an empty folder and imported from another directory: train step, save, model card, pipeline."""
    env = {**os.environ, "TALK_HF_SKIP_BUILD": "1"}
    source, wheels, site, work = (tmp_path / name for name in ("source", "wheels", "site", "work"))
    work.mkdir()
    _copy_checkout(source)
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "wheel", "--no-build-isolation", "--no-deps", "-w", str(wheels), str(source)], check=True,
                   env=env, capture_output=True)
    (wheel,) = wheels.glob("talk_hf-*.whl")
    with zipfile.ZipFile(wheel) as archive:  # pyproject.toml's metadata: the licence, the transformers range
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: MIT" in metadata and "Requires-Dist: transformers<5.25.0,>=5.20.0" in metadata
    subprocess.run([*pip, "install", "--no-deps", "--no-compile", "--target", str(site), str(wheel)], check=True,
                   capture_output=True)
    assert (site / "talk_hf" / "training" / "templates" / "translation.md").is_file()
    # -S: no .pth files, so the checkout's editable install (a finder that also resolves talk_hf._C) stays out;
    # the dependencies come from this interpreter's site-packages folders (not the checkout on sys.path)
    python = [sys.executable, "-S"]
    packages = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    env["PYTHONPATH"] = os.pathsep.join([str(site), *packages])
    result = subprocess.run([*python, "-c", USE, str(site)], cwd=work, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[-4:-1] == ["True", "document_bleu: 100", "no bundled corpus: True"], result.stdout
    env_report = subprocess.run([*python, "-m", "talk_hf", "env"], cwd=work, capture_output=True, text=True, env=env)
    assert env_report.returncode == 0, env_report.stderr[-3000:]
    assert "talk_hf._C is not built (the package was installed with TALK_HF_SKIP_BUILD=1)" in env_report.stdout
    assert (work / "model" / "README.md").is_file()
