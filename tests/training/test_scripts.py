"""Every script end to end on tiny data (in-process `main([...])` calls; `--help` for each)."""

import argparse
import gzip
import importlib.util
import json
import math
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from datasets import load_from_disk
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from talk_hf.training.evaluation import translate
from talk_hf.training.loop import inverse_sqrt_schedule

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "multi30k_pairs.tsv"
TINY = ["d_model=16", "encoder_layers=1", "decoder_layers=1", "encoder_ffn_dim=32", "decoder_ffn_dim=32",
        "encoder_heads=2", "decoder_heads=2", "decoder_attention_heads=2", "encoder_max_offsets=[2]",
        "decoder_max_offsets=[3]"]


def script(name):
    """A script of scripts/ or benchmarks/ imported as a module, its folder first on sys.path as when it runs."""
    path = next(p for p in (ROOT / "scripts" / f"{name}.py", ROOT / "benchmarks" / f"{name}.py") if p.exists())
    spec = importlib.util.spec_from_file_location(f"script_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


@pytest.mark.parametrize("name", ["preprocess", "train", "evaluate_model", "translate", "average_checkpoints", "demo",
                                  "benchmark_ops", "benchmark_generation", "benchmark_training", "decoding_bound",
                                  "profile_decoding", "results_multi30k",
                                  "results_doc_zh_en",
                                  "results_lm"])
def test_help(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script(name).main(["--help"])
    assert exit_info.value.code == 0
    assert "usage" in capsys.readouterr().out.lower()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """preprocess -> train (3 updates, checkpoints every update) on the fixture pairs."""
    root = tmp_path_factory.mktemp("run")
    script("preprocess").main(["--tsv", f"train={FIXTURE}", "--tsv", f"valid={FIXTURE}", "--tsv", f"test={FIXTURE}",
                               "--vocab_size", "200", "--output_dir", str(root / "data")])
    results = script("train").main([
        "--data", str(root / "data"), "--model", "talk", "--set", *TINY, "--output_dir", str(root / "talk"),
        "--max_tokens", "512", "--max_steps", "3", "--save_every", "1", "--warmup_steps", "1", "--bleu_sentences", "8",
        "--max_new_tokens", "6", "--test_split", "test", "--test_limit", "8",
    ])
    return root, results


def test_train_writes_a_complete_run(run):
    root, results = run
    assert results["steps"] == 3 and results["test_sentences"] == 8 and 0 <= results["test_bleu"] <= 100
    assert results["bleu_signature"].startswith("nrefs:1")
    model_dir = root / "talk" / "model"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md", "eval_results.json",
                 "metrics.jsonl", "metrics.png", "talk_conv.py"):
        assert (model_dir / name).exists(), name
    assert json.loads((model_dir / "eval_results.json").read_text())["steps"] == 3


def test_a_missing_test_split_fails_before_training(run, tmp_path):
    root, _ = run
    with pytest.raises(FileNotFoundError, match="nope"):
        script("train").main(["--data", str(root / "data"), "--model", "talk", "--set", *TINY, "--output_dir",
                              str(tmp_path / "talk"), "--max_tokens", "512", "--max_steps", "2",
                              "--test_split", "nope"])
    assert not (tmp_path / "talk").exists()  # nothing trained


def test_evaluate_model_loss_reproduces_the_runs_last_validation(run):
    """--metric loss on the saved model gives the run's last validation loss and source gain (both logged and
    reported in eval_results.json)."""
    root, results = run
    last = [json.loads(line) for line in (root / "talk" / "metrics.jsonl").read_text().splitlines()][-1]
    scored = script("evaluate_model").main(["--model", str(root / "talk" / "model"), "--data", str(root / "data"),
                                            "--split", "valid", "--metric", "loss", "--max_tokens", "512"])
    assert scored["loss"] == pytest.approx(last["valid_loss"], rel=1e-5) and scored["tokens"] > 0
    assert scored["source_gain"] == pytest.approx(last["valid_source_gain"], rel=1e-4, abs=1e-6)
    assert scored["source_gain_tokens"] > 0 and results["valid_source_gain"] == last["valid_source_gain"]


def test_reported_bleu_is_what_the_saved_model_gives(run, tmp_path):
    """The BLEU a run reports (validation and test) and its test translations are reproduced by
    scripts/evaluate_model.py on the saved model in a fresh process with no generation flags (it takes the model's saved
    generation settings), and equal uncached generation."""
    root, results = run
    model_dir, hypotheses = root / "talk" / "model", (root / "talk" / "test_hypotheses.txt").read_text().splitlines()
    valid_bleu = [json.loads(line)
                  for line in (root / "talk" / "metrics.jsonl").read_text().splitlines()][-1]["valid_bleu"]
    for split, reported, limit in (("test", results["test_bleu"], 8), ("valid", valid_bleu, 8)):
        out = tmp_path / f"{split}.json"
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "evaluate_model.py"), "--model", str(model_dir), "--data",
             str(root / "data"), "--split", split, "--limit", str(limit), "--output", str(out),
             "--hypotheses", str(tmp_path / f"{split}.txt")],
            check=True, capture_output=True,
        )
        scored = json.loads(out.read_text())
        assert scored["bleu"] == reported, split
        assert scored["generation"] == {"num_beams": 4, "length_penalty": 1.0, "max_new_tokens": 6}  # the run's
    assert (tmp_path / "test.txt").read_text().splitlines() == hypotheses
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    sources = load_from_disk(str(root / "data" / "test"))["source"][:8]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert translate(model, tokenizer, sources, max_new_tokens=6, use_cache=False) == hypotheses


def test_evaluate_scores_a_prepared_split_and_raw_files(run, tmp_path):
    root, _ = run
    model = str(root / "talk" / "model")
    prepared = script("evaluate_model").main(["--model", model, "--data", str(root / "data"), "--split", "test",
                                        "--max_new_tokens", "5", "--num_beams", "2"])
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    pairs = [line.split("\t") for line in FIXTURE.read_text().splitlines()]
    src.write_text("\n".join(p[0] for p in pairs) + "\n")
    ref.write_text("\n".join(p[1] for p in pairs) + "\n")
    raw = script("evaluate_model").main(["--model", model, "--source", str(src), "--reference", str(ref),
                                   "--max_new_tokens", "5", "--num_beams", "2", "--output", str(tmp_path / "r.json")])
    assert prepared["sentences"] == raw["sentences"] == 64
    assert prepared["bleu"] == pytest.approx(raw["bleu"])
    assert json.loads((tmp_path / "r.json").read_text())["bleu"] == raw["bleu"]
    # gzipped files, and a U+2028 inside a reference line: still one segment per line (str.splitlines would split it)
    with gzip.open(tmp_path / "ref.txt.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(p[1] + ("\u2028" if i == 3 else "") for i, p in enumerate(pairs)) + "\n")
    with gzip.open(tmp_path / "src.txt.gz", "wt", encoding="utf-8") as f:
        f.write(src.read_text())
    zipped = script("evaluate_model").main(["--model", model, "--source", str(tmp_path / "src.txt.gz"), "--reference",
                                      str(tmp_path / "ref.txt.gz"), "--max_new_tokens", "5", "--num_beams", "2"])
    assert zipped["sentences"] == 64


def test_translate_keeps_lines_aligned(run, tmp_path):
    root, _ = run
    source = tmp_path / "in.de"
    source.write_text("Ein Hund läuft.\n\nZwei\u2028Männer.\n", encoding="utf-8")  # U+2028 stays in its line
    out = script("translate").main(["--model", str(root / "talk" / "model"), "--input", str(source),
                                    "--output", str(tmp_path / "out.en"), "--max_new_tokens", "4"])
    lines = (tmp_path / "out.en").read_text(encoding="utf-8").split("\n")
    assert len(out) == 3 and out[1] == "" and lines[:3] == out


def test_average_checkpoints_script(run, tmp_path):
    root, _ = run
    target = script("average_checkpoints").main(["--run", str(root / "talk"), "--last", "2", "--output",
                                                 str(tmp_path / "avg")])
    found = sorted((root / "talk" / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))[-2:]
    states = [load_file(str(p / "model.safetensors")) for p in found]
    model = AutoModelForSeq2SeqLM.from_pretrained(target)
    key = "model.encoder.layers.0.mixer.linear1.weight"
    torch.testing.assert_close(model.state_dict()[key], (states[0][key] + states[1][key]) / 2)
    card = ModelCard.load(Path(target) / "README.md")
    assert f"{found[0].name} {found[1].name}" in card.text
    assert not card.data.eval_results  # the run's scores are another model's
    from talk_hf.training.model_card import write_model_card

    shutil.copytree(root / "talk" / "model", tmp_path / "carded")
    write_model_card(tmp_path / "carded", model, languages=["de", "en"], license="mit", datasets=["multi30k"])
    assert script("average_checkpoints").card_metadata(tmp_path / "carded") == {
        "languages": ["de", "en"], "license": "mit", "datasets": ["multi30k"], "base_model": None}
    with pytest.raises(SystemExit, match="fewer than"):
        script("average_checkpoints").main(["--run", str(root / "talk"), "--last", "99", "--output", str(tmp_path)])
    (tmp_path / "killed" / "checkpoints").mkdir(parents=True)
    shutil.copytree(found[0], tmp_path / "killed" / "checkpoints" / found[0].name)
    with pytest.raises(SystemExit, match="has no model/ folder"):
        script("average_checkpoints").main(["--run", str(tmp_path / "killed"), "--last", "1", "--output",
                                            str(tmp_path / "o")])


def test_train_records_the_scored_split_and_limit(run):
    """--test_limit 8 of the 64 test rows: eval_results.json records the split and the limit, and the card's table
    labels the scores as those of the first 8 sentences."""
    root, results = run
    assert (results["test_split"], results["test_limit"]) == ("test", 8)
    evaluation = (root / "talk" / "model" / "README.md").read_text().split("## Evaluation results")[1]
    assert "| first 8 sentences of test | BLEU |" in evaluation


def test_averaged_card_keeps_the_runs_training_history(run, tmp_path):
    """A run fine-tuned from a local folder, averaged: the averaged card names the same base model, repository and
    model name as the run's card (as the run's eval_results.json records them)."""
    from talk_hf.training.loop import TrainConfig
    from talk_hf.training.model_card import MODEL_ID_PLACEHOLDER
    from talk_hf.training.models import parse_overrides
    from talk_hf.training.run import train_run

    root, _ = run
    base = str(root / "talk" / "model")
    config = TrainConfig(output_dir=str(tmp_path / "tuned"), max_tokens=512, max_steps=2, save_every=1,
                         warmup_steps=1, bleu_sentences=0)
    card = {"languages": ["de", "en"], "datasets": ["multi30k"], "license": "mit", "base_model": base,
            "repo_id": "user/talk-tuned"}  # as scripts/train.py --init_from --push_to_hub builds it
    train_run(root / "data", "talk", config, overrides=parse_overrides(TINY), card=card,
              init_from=base)
    target = script("average_checkpoints").main(["--run", str(tmp_path / "tuned"), "--last", "2", "--output",
                                                 str(tmp_path / "avg")])
    run_card = (tmp_path / "tuned" / "model" / "README.md").read_text()
    averaged = (Path(target) / "README.md").read_text()
    history = [line for line in run_card.splitlines() if "fine-tuned from" in line]
    assert history and f"`{base}`" in history[0]
    assert [line for line in averaged.splitlines() if "fine-tuned from" in line] == history
    assert "from scratch" not in averaged and MODEL_ID_PLACEHOLDER not in averaged
    assert 'from_pretrained("user/talk-tuned")' in averaged and averaged.startswith("---")
    assert "\n# talk-tuned\n" in averaged and ModelCard(averaged).data.license == "mit"


def test_demo_smoke(tmp_path, capsys):
    results = script("demo").main(["--output_dir", str(tmp_path), "--max_steps", "2", "--test_limit", "4",
                                   "--valid_bleu_sentences", "0", "--vocab_size", "2000"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"sacreBLEU (Multi30k test2016, de->en, beam 4): {results['test_bleu']:.2f}"
    assert (tmp_path / "talk" / "model" / "README.md").exists()


def test_results_runner_writes_a_table(run, tmp_path, monkeypatch):
    root, _ = run
    module = script("results_multi30k")
    small = {k: {**v, "d_model": 16, "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "encoder_layers": 1,
                 "decoder_layers": 1, "decoder_attention_heads": 2} for k, v in module.ROWS.items()}
    for k in ("talk",):
        small[k].update(encoder_heads=2, decoder_heads=2, encoder_max_offsets=[1], decoder_max_offsets=[1])
    small["marian"]["encoder_attention_heads"] = 2
    monkeypatch.setattr(module, "ROWS", small)
    args = ["--data", str(root / "data"), "--output_dir", str(tmp_path), "--rows", "talk", "marian",
            "--grid_learning_rates", "1e-3", "3e-3", "--grid_warmup_steps", "2", "--grid_steps", "2",
            "--grid_extensions", "0", "--max_steps", "6", "--eval_every", "2", "--patience", "1", "--test_limit", "4",
            "--max_tokens", "512"]
    with pytest.raises(SystemExit, match="talk: 0 of the grid's 2 runs"):
        module.main([*args, "--stages", "final"])
    tables = module.main(args)
    grid = json.loads((tmp_path / "grid.json").read_text())
    assert [(r["model"], r["learning_rate"], r["steps"]) for r in grid] == [
        ("talk", 1e-3, 2), ("talk", 3e-3, 2), ("marian", 1e-3, 2), ("marian", 3e-3, 2)]
    final = json.loads((tmp_path / "results.json").read_text())
    for row in final:  # each final run trains at its model's chosen point, until patience or the cap
        chosen = min((r for r in grid if r["model"] == row["model"]), key=lambda r: r["valid_loss"])
        assert row["learning_rate"] == chosen["learning_rate"] and row["warmup_steps"] == 2
        assert row["steps"] == (row["best_step"] + 2 if row["stopped_early"] else 6)
        assert 0 <= row["test_chrf"] <= 100 and row["chrf_signature"].startswith("nrefs:1")
    assert [r["model"] for r in final] == ["talk", "marian"] and (tmp_path / "valid_loss.png").exists()
    assert set(tables) == {"grid.md", "short_budget.md", "results.md"}
    assert (tables["results.md"] == (tmp_path / "results.md").read_text().strip()
            and "| marian |" in tables["results.md"])
    assert len(tables["grid.md"].splitlines()) == 2 + 4 and len(tables["short_budget.md"].splitlines()) == 2 + 2

    trained = []
    monkeypatch.setattr(module, "train_run", lambda *a, **k: trained.append(a) or {})
    module.main([*args, "--stages", "tune"])
    assert trained == []  # every grid point is recorded: nothing is trained again


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_accelerate_launch_two_processes(run, local_hub, tmp_path):  # noqa: F811
    """`accelerate launch` with 2 CPU processes (torchrun + gloo; `--cpu` alone would start a single process): the
    same loop runs data-parallel, one model and one set of checkpoints are saved, and --push_to_hub uploads the
    finished model folder once (from the main process, the one that wrote it)."""
    root, _ = run
    env = {**local_hub.subprocess_env(tmp_path / "hf_home"), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    result = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
         "--num_machines", "1",
         "--main_process_port", str(free_port()),
         "--mixed_precision", "no", "--dynamo_backend", "no", str(ROOT / "scripts" / "train.py"),
         "--data", str(root / "data"), "--model", "talk", "--set", *TINY, "--output_dir", str(tmp_path / "ddp"),
         "--max_tokens", "256", "--max_steps", "3", "--save_every", "2", "--warmup_steps", "1",
         "--bleu_sentences", "0", "--max_new_tokens", "6", "--test_split", "test", "--test_limit", "4",
         "--log_every", "1", "--push_to_hub", "user/ddp"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "ddp" / "eval_results.json").read_text())
    assert results["num_processes"] == 2 and results["steps"] == 3
    # the schedule counts updates whatever the number of processes (each logged rate: the one that update used)
    logged = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=5e-4)
    schedule = inverse_sqrt_schedule(optimizer, warmup_steps=1, warmup_init_lr=1e-7)
    expected = []
    for _ in range(3):
        expected.append(schedule.get_last_lr()[0])
        optimizer.step()
        schedule.step()
    assert [r["lr"] for r in logged if "lr" in r] == pytest.approx(expected)
    assert (tmp_path / "ddp" / "model" / "model.safetensors").exists()
    assert sorted(p.name for p in (tmp_path / "ddp" / "checkpoints").iterdir()) == ["step-2", "step-3"]
    assert result.stdout.count("pushed to ") == 1 and len(local_hub.requests_matching("/commit/")) == 1
    files = local_hub.files("user/ddp")
    for name in ("model.safetensors", "README.md", "eval_results.json", "metrics.png", "tokenizer.json"):
        assert files[name] == (tmp_path / "ddp" / "model" / name).read_bytes(), name


def test_record_result_replaces_only_the_rerun_row(tmp_path):
    from talk_hf.training.run import record_result
    from talk_hf.training.tables import markdown_table

    path = tmp_path / "r" / "results.json"
    record_result(path, {"name": "a", "window": 1, "bleu": 1.0}, ("name", "window"))
    record_result(path, {"name": "a", "window": 4, "bleu": 2.0}, ("name", "window"))
    rows = record_result(path, {"name": "a", "window": 1, "bleu": 3.0}, ("name", "window"))
    assert [(r["window"], r["bleu"]) for r in rows] == [(4, 2.0), (1, 3.0)] and all(r["device"] for r in rows)
    assert json.loads(path.read_text()) == rows
    table = markdown_table(rows, [("window", lambda r: str(r["window"])), ("BLEU", lambda r: f"{r['bleu']:.1f}")])
    assert table.splitlines() == ["| window | BLEU |", "|---|---|", "| 4 | 2.0 |", "| 1 | 3.0 |"]


def as_installed(monkeypatch, tmp_path):
    """The package's default corpus locations as in a non-editable install (no data/ beside the package): the
    scripts must read the corpora of the checkout they run from."""
    from talk_hf.training import corpora

    for name in ("WIKI_ZH_EN_ARCHIVE", "WIKITEXT2_DIR", "IWSLT15_ZH_EN_DIR"):
        monkeypatch.setattr(corpora, name, tmp_path / "site-packages" / "data" / name)


def test_doc_results_runner_scores_every_test_window(tmp_path, monkeypatch):
    from talk_hf.training import prepare

    as_installed(monkeypatch, tmp_path)
    module = script("results_doc_zh_en")
    load = prepare.load_wiki_zh_en
    monkeypatch.setattr(prepare, "load_wiki_zh_en",  # 40 lines per split
                        lambda split, archive=None: load(split, archive=archive).select(range(40)))
    tiny = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32, decoder_ffn_dim=32,
                encoder_attention_heads=2, decoder_attention_heads=2)
    monkeypatch.setattr(module, "MODELS", {name: (kind, {**values, **tiny})
                                           for name, (kind, values) in module.MODELS.items()})
    limits = []  # the data each row's limit on new tokens comes from; 6: untrained models never stop early
    monkeypatch.setattr(module, "max_new_tokens", lambda data_dir: limits.append(Path(data_dir).name) or 6)
    args = ["--output_dir", str(tmp_path), "--grid_learning_rates", "1e-3", "--grid_warmup_steps", "1",
            "--grid_steps", "2", "--max_steps", "2", "--eval_every", "1", "--patience", "2", "--max_tokens", "1024",
            "--vocab_size", "300", "--num_beams", "1", "--init_from_sentence_level"]
    with pytest.raises(SystemExit, match="run rfa_doc-nogate@1 to its end first"):
        module.main([*args, "--rows", "rfa_doc-gate@3", "--grid_min_source_gain", "0"])
    # two updates teach no encoder to read its source: the runner's threshold (0.1 nats) refuses every grid point
    with pytest.raises(SystemExit, match="rfa_doc-nogate-1: no point of its grid reads its source"):
        module.main([*args, "--rows", "rfa_doc-nogate@1"])
    assert "| rfa_doc-nogate | 1 | 0.001 | 1 |" in (tmp_path / "grid.md").read_text()  # the refused grid, tabulated
    grid_point, = json.loads((tmp_path / "grid.json").read_text())
    assert "test_bleu" not in grid_point and grid_point["valid_source_gain"] < 0.1  # chosen on dev: no test run
    assert not (tmp_path / "grid" / "rfa_doc-nogate-1" / "lr0.001-wu1" / "test_hypotheses.txt").exists()
    args += ["--grid_min_source_gain", "0"]
    tables = module.main([*args, "--rows", "rfa_doc-nogate@1", "rfa_doc-gate@3"])
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [(r["name"], r["window"]) for r in rows] == [("rfa_doc-nogate", 1), ("rfa_doc-gate", 3)]
    assert all(r["test_sentences"] == 40 and r["steps"] == 2 for r in rows)  # every window scored, none dropped
    gated = rows[1]  # started from the ungated sentence-level model: only its gates kept their initialisation
    assert gated["init_from"].endswith("final/rfa_doc-nogate-1/model") and "test_d_bleu" in gated
    assert gated["test_context_shortened"] == 0 and "test windows shortened" in tables["results.md"]
    assert all(0 <= r["test_chrf"] <= 100 for r in rows) and "zh2en-test chrF" in tables["results.md"]
    assert gated["not_initialised"] == ["model.decoder.layers.0.mixer.gate.bias",
                                        "model.decoder.layers.0.mixer.gate.weight"]
    windows = json.loads((tmp_path / "data_w3" / "preprocess.json").read_text())
    assert windows["args"]["tokenizer"].endswith("data_w1/tokenizer")  # one tokenizer for both window sizes
    assert "| rfa_doc-gate | 3 |" in tables["results.md"] and "| rfa_doc-nogate | 1 |" in tables["short_budget.md"]
    assert "dev source gain" in tables["results.md"] and all(math.isfinite(r["valid_source_gain"]) for r in rows)
    assert set(limits) == {"data_w1"}  # a sentence at a time: the window-3 row's limit is a sentence's too
    with pytest.raises(SystemExit):
        module.main(["--rows", "transformer@4"])
    module.main([*args, "--rows", "marian@1", "--stages", "tune", "--grid_test", "--test_limit", "5"])
    grid_point, = [r for r in json.loads((tmp_path / "grid.json").read_text()) if r["name"] == "marian"]
    assert grid_point["test_sentences"] == 5 and 0 <= grid_point["test_bleu"] <= 100  # --grid_test: translated


def test_lm_results_runner_reports_perplexity(tmp_path, monkeypatch):
    module = script("results_lm")
    tiny = {k: {**v, "d_model": 16, "decoder_layers": 1, "decoder_ffn_dim": 32} for k, v in module.ROWS.items()}
    tiny["talk_lm"]["decoder_max_offsets"] = [3]
    monkeypatch.setattr(module, "ROWS", tiny)
    lines = [line.replace("\t", " ") for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    monkeypatch.setattr(module, "corpus_texts",
                        lambda corpus: {"train": lines, "valid": lines[:16], "test": lines[16:32]})
    tables = module.main(["--output_dir", str(tmp_path / "lm"), "--corpora", "tinyshakespeare",
                          "--grid_learning_rates", "1e-3", "--grid_warmup_steps", "1", "2", "--grid_steps", "2",
                          "--max_steps", "4", "--eval_every", "2", "--patience", "1",
                          "--max_tokens", "128", "--block_size", "16", "--vocab_size", "200"])
    rows = json.loads((tmp_path / "lm" / "results.json").read_text())
    assert [(r["corpus"], r["model"]) for r in rows] == [("tinyshakespeare", "talk_lm"), ("tinyshakespeare", "gpt2")]
    for r in rows:
        assert r["steps"] in (2, 4) and 1 < r["valid_ppl"] < 1e6 and 1 < r["test_ppl"] < 1e6
        assert r["valid_ppl"] == pytest.approx(math.exp(r["valid_loss"]))
        assert r["test_ppl"] == pytest.approx(math.exp(r["test_loss"])) and r["test_tokens"] > 0
    assert "| tinyshakespeare | gpt2 |" in tables["results.md"] and len(tables["grid.md"].splitlines()) == 2 + 4
    assert (tmp_path / "lm" / "valid_loss.png").exists()


def test_lm_corpora_hold_out_validation_and_test_text(tmp_path, monkeypatch):
    as_installed(monkeypatch, tmp_path)
    module = script("results_lm")
    shakespeare = module.corpus_texts("tinyshakespeare")
    assert [len(v) for v in shakespeare.values()] == [36000, 2000, 2000]
    wikitext = module.corpus_texts("wikitext2")
    assert [len(v) for v in wikitext.values()] == [36718, 3760, 4358]


def small_generation_benchmark(monkeypatch):
    """benchmarks/benchmark_generation.py with one-layer models of width 16."""
    module = script("benchmark_generation")
    monkeypatch.setattr(module, "D", 16)
    monkeypatch.setattr(module, "LAYERS", 1)
    monkeypatch.setattr(module, "SEQ2SEQ", {**module.SEQ2SEQ, "d_model": 16, "encoder_layers": 1, "decoder_layers": 1,
                                            "encoder_ffn_dim": 32, "decoder_ffn_dim": 32})
    return module


def test_generation_benchmark_paper_rows_scale_the_papers_batches(tmp_path, monkeypatch):
    """--rows paper: RFA-doc vs Marian at the RFA paper's windows with its batch sizes times --batch_scale, L * 20
    source and L * 23 new tokens (here at one layer of width 16), greedy and beam 4, and the speed-up plot."""
    module = script("benchmark_generation")
    monkeypatch.setattr(module, "PAPER_SIZE", dict(d_model=16, layers=1, heads=2, ffn=32))
    rows = module.main(["--rows", "paper", "--paper_windows", "1", "2", "--batch_scale", "0.005", "--repeats", "1",
                        "--speedup_plot", str(tmp_path / "s.png"), "--output", str(tmp_path / "p.json")])
    assert [(r["window"], r["batch"], r["num_beams"], r["new_tokens"]) for r in rows] == [
        (1, 5, 1, 23), (1, 5, 4, 23), (2, 3, 1, 46), (2, 3, 4, 46)]  # round(1024 / 200), round(512 / 200)
    assert all("RFA-doc vs Marian" in r["row"] and r["speedup"] > 0 for r in rows)
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "p.json").read_text())["rows"][-1]["window"] == 2


def test_generation_benchmark_redraws_saved_results(tmp_path, capsys):
    """--from_results: the table and the speed-up plot of the paper's windows and the longer ones, from the shipped
    JSON files, nothing measured."""
    module = script("benchmark_generation")
    saved = [ROOT / "benchmarks/results/cpu_rfa_paper_2026-11-25/paper.json",
             ROOT / "benchmarks/results/cpu_rfa_longer_windows_2026-11-25/longer.json"]
    rows = module.main(["--from_results", *map(str, saved), "--speedup_plot", str(tmp_path / "s.png")])
    assert [r["window"] for r in rows] == [1, 1, 4, 4, 15, 15, 30, 30, 60, 60]
    assert ("| paper window 60, batch 3, beam 4 (RFA-doc vs Marian) | 1380 | 126 | 26 | 4.78x |"
            in capsys.readouterr().out)
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit):
        module.main(["--from_results", str(saved[0]), "--output", str(tmp_path / "x.json")])


def test_decoding_bound_counts_each_models_state_and_measures_the_machine(tmp_path, monkeypatch):
    """benchmarks/decoding_bound.py: the bytes of decoding state per layer, token and sequence (Marian's grow with the
    window, RFA-doc's cross-attention source is the smaller of its two forms) and a bound row per window."""
    module = script("decoding_bound")
    # L = 1: 20 source tokens, keys and values (20 x 8 x (512 + 65) floats) are smaller than the state (8 x 512 x 65)
    assert module.rfa_state_bytes(1, 8, 64, 32, 256) == (2 * 4 * 8 * 64 * 65, 4 * 20 * 8 * 577)
    assert module.rfa_state_bytes(15, 8, 64, 32, 256) == (2 * 4 * 8 * 64 * 65, 4 * 8 * 512 * 65)  # 300 tokens: state
    assert module.marian_state_bytes(1, 512) == (3 * 2 * 12 * 512 * 4, 2 * 20 * 512 * 4)  # 12 tokens cached on average
    self_15, cross_15 = module.marian_state_bytes(15, 512)
    assert (self_15, cross_15) == (3 * 2 * 173 * 512 * 4, 15 * 2 * 20 * 512 * 4)  # 345 steps: 173 cached on average
    tiny = script("benchmark_generation")
    monkeypatch.setattr(tiny, "PAPER_SIZE", dict(d_model=16, layers=1, heads=2, ffn=32))
    monkeypatch.setattr(module, "models", tiny.models)
    rows = module.main(["--windows", "1", "15", "--batch_scale", "0.01", "--bandwidth_mb", "8",
                        "--output", str(tmp_path / "b.json")])
    assert [(r["window"], r["batch"]) for r in rows] == [(1, 10), (15, 1)]
    assert all(r["speedup_bound"] > 0 and r["weights_ms"] > 0 and r["features_ms"] > 0 for r in rows)
    assert json.loads((tmp_path / "b.json").read_text())["rows"][1]["window"] == 15


def test_generation_benchmark_paper_rows_time_ctranslate2_on_the_same_sources(tmp_path, monkeypatch, capsys):
    """--ctranslate2: the paper rows' Marian converted by CTranslate2's converter and timed in fp32 and int8 on the
    same sources, each output exactly the row's new tokens long."""
    module = script("benchmark_generation")
    monkeypatch.setattr(module, "PAPER_SIZE", dict(d_model=16, layers=1, heads=2, ffn=32))
    rows = module.main(["--rows", "paper", "--paper_windows", "1", "--batch_scale", "0.005", "--repeats", "1",
                        "--paper_beams", "1", "--ctranslate2", str(tmp_path / "ct2")])
    assert len(rows) == 1 and rows[0]["ctranslate2_float32_tokens_per_s"] > 0
    assert rows[0]["ctranslate2_int8_tokens_per_s"] > 0
    assert "CTranslate2 tokens/s, fp32 / int8" in capsys.readouterr().out
    translator = module.ctranslate2_translator(None, tmp_path / "ct2", "float32")  # converted above: loaded again
    sources = [["w5", "w9", "</s>"], ["w6", "</s>"]]
    results = translator.translate_batch(sources, beam_size=4, min_decoding_length=23, max_decoding_length=23)
    assert [len(r.hypotheses[0]) for r in results] == [23, 23]


def test_generation_benchmark_streaming_rows_time_every_sentence(tmp_path, monkeypatch):
    """--rows streaming: one document translated by RFA-doc streaming and by sliding windows (RFA-doc, Marian), each
    sentence its own generate() call, timed: the whole document's tokens/s and its first and last tenth's."""
    module = script("benchmark_generation")
    monkeypatch.setattr(module, "PAPER_SIZE", dict(d_model=16, layers=1, heads=2, ffn=32))
    rows = module.main(["--rows", "streaming", "--stream_sentences", "10", "--stream_window", "2",
                        "--output", str(tmp_path / "s.json"), "--plot", str(tmp_path / "s.png")])
    assert [r["row"] for r in rows] == ["RFA-doc streaming, 10 sentences", "RFA-doc sliding windows of 2, 10 sentences",
                                        "Marian sliding windows of 2, 10 sentences"]
    assert all(r["tokens_per_s"] > 0 and r["first_tenth_tokens_per_s"] > 0 and r["last_tenth_tokens_per_s"] > 0
               for r in rows)


def test_generation_benchmark_reports_speed_and_cache_sizes(tmp_path, monkeypatch):
    module = small_generation_benchmark(monkeypatch)
    compiled_calls = []

    def traced_decoding(device):  # the script's compile settings, with a tracing-only backend (no inductor build)
        kwargs = compiled_decoding(device)
        kwargs["compile_config"].backend, kwargs["compile_config"].mode = counting_backend, None
        return kwargs

    def counting_backend(graph_module, example_inputs):
        compiled_calls.append(graph_module)
        return graph_module.forward

    compiled_decoding = module.compiled_decoding
    monkeypatch.setattr(module, "compiled_decoding", traced_decoding)
    rows = module.main(["--lm_tokens", "5", "20", "--lm_batch", "1", "3", "--windows", "1", "3", "--repeats", "1",
                        "--compile", "--output", str(tmp_path / "g.json"), "--plot", str(tmp_path / "g.png")])
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [(r["kind"], r["compiled"]) for r in rows] == (
        [("lm", False), ("lm", True)] * 4 + [("translation", False), ("translation", True), ("translation", False)] * 2
        + [("document", False), ("document", True)] * 2)
    assert "DynamicConv" in rows[11]["row"] and rows[9]["row"].endswith("compiled")
    assert len(compiled_calls) >= 5  # every compiled row compiled (talk_hf and its baseline)
    assert all(r["talk_hf_tokens_per_s"] > 0 and r["baseline_tokens_per_s"] > 0 for r in rows)
    lm_short, lm_long, lm_wide = rows[0], rows[2], rows[6]
    assert "batch 1 " in lm_short["row"] and "batch 3 " in lm_wide["row"]
    # the recurrent state does not grow with the generated length; GPT-2's key/value cache does
    assert lm_short["talk_hf_cache_MB"] == lm_long["talk_hf_cache_MB"]
    assert lm_long["baseline_cache_MB"] > 1.5 * lm_short["baseline_cache_MB"]
    assert lm_wide["baseline_cache_MB"] == pytest.approx(3 * lm_long["baseline_cache_MB"], rel=0.01)
    # every compiled row's static cache is sized for its own length, not for an earlier, longer row's
    compiled_short, compiled_long, compiled_wide_short = rows[1], rows[3], rows[5]
    assert compiled_long["baseline_cache_MB"] > compiled_short["baseline_cache_MB"]
    assert compiled_wide_short["baseline_cache_MB"] == pytest.approx(3 * compiled_short["baseline_cache_MB"], rel=0.01)
    assert json.loads((tmp_path / "g.json").read_text())["rows"][-1]["new_tokens"] == 72


def test_training_benchmark_times_layers_and_whole_steps(tmp_path):
    module = script("benchmark_training")
    rows = module.main(["--d_model", "16", "--layers", "1", "--ffn", "32", "--heads", "2", "--batch", "2", "--length",
                        "12", "--lengths", "8", "40", "--iters", "2", "--warmup", "1",
                        "--output", str(tmp_path / "t.json"), "--plot", str(tmp_path / "t.png")])
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [(r["kind"], r["n"]) for r in rows] == [("layer", 8), ("layer", 40), ("model", 12)]
    for r in rows:
        for kind in ("talk", "dynamic_conv", "lightconv", "marian"):
            assert r[f"{kind}_tokens_per_s"] > 0
        assert r["talk_over_marian"] == pytest.approx(r["talk_tokens_per_s"] / r["marian_tokens_per_s"])
    model_row = rows[-1]
    assert model_row["tokens"] == 24 and model_row["bart_tokens_per_s"] > 0
    # same-size models: the token mixers differ, embeddings and feed-forwards do not
    assert 0.5 < model_row["talk_params_M"] / model_row["marian_params_M"] < 2
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["rows"] == json.loads(json.dumps(rows)) and saved["environment"]["args"]["lengths"] == [8, 40]


def test_training_benchmark_trains_the_layers_it_times():
    """The timed layer step really runs a backward: every parameter of the layer gets a gradient."""
    module = script("benchmark_training")
    args = argparse.Namespace(d_model=16, layers=1, ffn=32, heads=2, lengths=[8], length=8, amp="none")
    for kind in ("talk", "dynamic_conv", "marian"):
        layer = module.build(kind, args).get_encoder().layers[0].train()
        x = torch.randn(2, 8, 16, requires_grad=True)
        module.layer_step(layer, x, args, torch.device("cpu"))()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters()), kind


def test_benchmark_script_reports_ratios(tmp_path):
    rows = script("benchmark_ops").main(["--lengths", "16", "--batch", "1", "--channels", "8", "--heads", "2",
                                         "--max_offset", "3", "--iters", "3", "--budget", "0.2",
                                         "--output", str(tmp_path / "b.json"), "--plot", str(tmp_path / "b.png")])
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "b.json").read_text())
    assert saved["rows"][0]["n"] == 16 and rows[0]["talk_vs_copy"] > 0 and rows[0]["talk_vs_copy_into"] > 0
    assert rows[0]["talk_vs_copy_interleaved"] > 0 and rows[0]["talk_vs_copy_into_interleaved"] > 0
    assert "sdpa_over_talk" in rows[0] and rows[0]["softmax_unfused_over_fused_fwdbwd"] > 0


from tests.hub_server import local_hub  # noqa: E402,F401  (pytest fixture)


def test_train_push_to_hub_uploads_the_run(run, local_hub, tmp_path):  # noqa: F811
    root, _ = run
    script("train").main([
        "--data", str(root / "data"), "--model", "talk", "--set", *TINY, "--output_dir", str(tmp_path / "pushed"),
        "--max_tokens", "512", "--max_steps", "1", "--warmup_steps", "1", "--bleu_sentences", "0",
        "--push_to_hub", "user/talk-tiny", "--hub_revision", "v1", "--hub_private",
    ])
    files = local_hub.files("user/talk-tiny", revision="v1")
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md",
                 "eval_results.json", "metrics.jsonl", "modeling_talk.py"):
        assert name in files, name
    assert local_hub.repo("user/talk-tiny").private
    assert b"user/talk-tiny" in files["README.md"]  # the card's usage snippet names the repository
    local = (tmp_path / "pushed" / "model" / "model.safetensors").read_bytes()
    assert files["model.safetensors"] == local


def test_generation_benchmark_translates_the_asked_number_of_sentences(monkeypatch):
    """--rows picks the rows; --sentences 40 translates two batches (32 + 8) in every translation row."""
    module = small_generation_benchmark(monkeypatch)
    generated = []
    generate = module.timed_generate

    def counting(model, batches, new_tokens, repeats, **kwargs):
        generated.append([b["input_ids"].shape[0] for b in batches])
        return generate(model, batches, new_tokens, repeats, **kwargs)

    monkeypatch.setattr(module, "timed_generate", counting)
    rows = module.main(["--rows", "translation", "--sentences", "40", "--repeats", "1"])
    assert [r["kind"] for r in rows] == ["translation"] * 4  # greedy and beam 4, TaLK and DynamicConv
    assert all("40 sentences" in r["row"] for r in rows)
    assert generated == [[32, 8]] * 8  # each model of each row

