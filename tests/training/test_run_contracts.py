"""What a training run promises: the same settings give the same model, the settings it takes are refused by name
outside their range, the command line reports a used or empty run folder as a usage error, the metrics log holds the
learning rate each update used and each update once across a resume, a resume keeps the model's config, and the
results tables take runs without patience."""

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from talk_hf.training.loop import TrainConfig, Trainer, checkpoints
from talk_hf.training.models import build_model
from talk_hf.training.run import load_prepared, train_run

from .test_cli_inputs import prepared_folder
from .test_loop import TINY, data, run, scripted_validation  # noqa: F401  (data: a pytest fixture)
from .test_scripts import FIXTURE, script


def records(output_dir):
    """The records of a run's metrics.jsonl, without their wall-clock time."""
    lines = (Path(output_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "elapsed"} for line in lines]


# ------------------------------------------------------------------------------------------ the seed


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A data folder written by scripts/preprocess.py from the fixture pairs."""
    folder = tmp_path_factory.mktemp("prepared") / "data"
    script("preprocess").main(["--tsv", f"train={FIXTURE}", "--tsv", f"valid={FIXTURE}", "--vocab_size", "200",
                               "--output_dir", str(folder)])
    return folder


def seeded_run(prepared, output_dir, seed):
    """train_run of a tiny talk model for 2 updates -> (results without the training time, final weights, metrics)."""
    config = TrainConfig(output_dir=str(output_dir), max_tokens=512, max_steps=2, warmup_steps=1, log_every=1,
                         bleu_sentences=0, seed=seed)
    results = train_run(prepared, "talk", config, overrides=dict(TINY))
    weights = load_file(str(Path(output_dir) / "model" / "model.safetensors"))
    return {k: v for k, v in results.items() if k != "train_minutes"}, weights, records(output_dir)


def test_the_seed_decides_the_initial_weights(prepared, tmp_path):
    """Two runs with the same seed give the same model and metrics whatever the random state before them (the first
    run leaves it elsewhere than it found it); another seed gives another model."""
    first, again, other = (seeded_run(prepared, tmp_path / name, seed) for name, seed in (("a", 1), ("b", 1), ("c", 2)))
    assert first[0] == again[0] and first[2] == again[2]
    assert first[1].keys() == again[1].keys() and all(first[1][k].equal(again[1][k]) for k in first[1])
    assert not all(first[1][k].equal(other[1][k]) for k in first[1])


# ------------------------------------------------------------------------------------------ settings out of range


@pytest.mark.parametrize("bad, message", [
    (dict(warmup_steps=0), "warmup_steps must be >= 1 with the inverse_sqrt schedule, got 0"),
    (dict(warmup_steps=-3), "warmup_steps must be >= 1 with the inverse_sqrt schedule, got -3"),
    (dict(warmup_steps=-1, schedule="cosine"), "warmup_steps must be >= 0 with the cosine schedule, got -1"),
    (dict(log_every=0), "log_every must be >= 1, got 0"),
    (dict(gradient_accumulation_steps=0), "gradient_accumulation_steps must be >= 1, got 0"),
    (dict(max_steps=-1), "max_steps must be >= 0, got -1"),
    (dict(max_epochs=-1), "max_epochs must be >= 0, got -1"),
    (dict(max_minutes=-1.0), "max_minutes must be >= 0, got -1.0"),
    (dict(eval_every=-1), "eval_every must be >= 0, got -1"),
    (dict(save_every=-2), "save_every must be >= 0, got -2"),
    (dict(clip_norm=-1.0), "clip_norm must be >= 0, got -1.0"),
    (dict(bleu_sentences=-3), "bleu_sentences must be >= 0, got -3"),
    (dict(max_tokens=0), "max_tokens must be >= 1, got 0"),
    (dict(learning_rate=-1.0), "learning_rate must be > 0, got -1.0"),
    (dict(learning_rate=math.nan), "learning_rate must be > 0, got nan"),
    (dict(adam_beta2=1.0), "adam_beta2 must be >= 0 and < 1, got 1.0"),
    (dict(average_last=3, keep_checkpoints=3), "average_last=3 averages the last checkpoints: it needs save_every > 0 "
                                               "(without it a run saves only its last one)"),
])
def test_settings_out_of_range_are_refused_by_name(bad, message):
    with pytest.raises(ValueError) as error:
        TrainConfig(**{"output_dir": "x", "max_steps": 1, **bad})
    assert str(error.value) == message


def test_the_ends_of_the_ranges_are_taken():
    config = TrainConfig(output_dir="x", max_steps=1, schedule="cosine", warmup_steps=0, eval_every=0, save_every=0,
                         clip_norm=0.0, bleu_sentences=0, max_epochs=0, max_minutes=0.0)
    assert config.warmup_steps == 0 and TrainConfig(output_dir="x", max_steps=1, warmup_steps=1).warmup_steps == 1


@pytest.mark.parametrize("flags, message", [
    (["--log_every", "0"], "log_every must be >= 1, got 0"),
    (["--warmup_steps", "0"], "warmup_steps must be >= 1 with the inverse_sqrt schedule"),
    (["--test_limit", "-1"], "--test_limit must be >= 0 (0: every test example), got -1"),
])
def test_train_refuses_settings_out_of_range_with_a_usage_error(flags, message, monkeypatch, tmp_path, capsys):
    train = script("train")
    monkeypatch.setattr(train, "train_run", lambda *args, **kwargs: pytest.fail("trained despite a bad flag"))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--data", prepared_folder(tmp_path / "data"), "--model", "talk", "--output_dir",
                    str(tmp_path / "o"), "--max_steps", "1", *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_train_run_refuses_a_negative_test_limit_before_training(tmp_path):
    with pytest.raises(ValueError, match=r"test_limit must be >= 0 \(0: every test example\), got -2"):
        train_run(tmp_path / "no data", "talk", TrainConfig(output_dir=str(tmp_path / "o"), max_steps=1),
                  test_limit=-2)
    assert not (tmp_path / "o").exists()


# ------------------------------------------------------------------------------------------ the run folder


def test_train_reports_a_used_or_empty_run_folder_as_a_usage_error(monkeypatch, tmp_path, capsys):
    """A new run into a folder holding another, or --resume where no checkpoint is: said, with no traceback, before
    anything is built."""
    train = script("train")
    trained = []
    monkeypatch.setattr(train, "train_run", lambda *args, **kwargs: trained.append(args) or {})
    out = tmp_path / "o"
    base = ["--data", prepared_folder(tmp_path / "data"), "--model", "talk", "--output_dir", str(out),
            "--max_steps", "1"]
    with pytest.raises(SystemExit) as exit_info:
        train.main([*base, "--resume"])
    assert exit_info.value.code == 2
    assert f"--resume: no checkpoint under {out / 'checkpoints'}" in capsys.readouterr().err
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 9.0}\n')
    with pytest.raises(SystemExit) as exit_info:  # a run stopped before its first checkpoint: nothing to resume
        train.main(base)
    assert exit_info.value.code == 2
    assert (f"{out} holds the metrics.jsonl of an earlier run that saved no checkpoint (nothing to resume): remove "
            f"{out / 'metrics.jsonl'} to train afresh there") in capsys.readouterr().err
    (out / "checkpoints" / "step-1").mkdir(parents=True)
    with pytest.raises(SystemExit) as exit_info:
        train.main(base)
    assert f"{out} holds an earlier run (checkpoints/, metrics.jsonl): continue it" in capsys.readouterr().err
    train.main([*base, "--resume"])
    assert len(trained) == 1


@pytest.mark.parametrize("repo", ["tiny-run", "a/b/c", "/x"])
def test_train_refuses_a_hub_repository_without_its_namespace_before_training(repo, monkeypatch, tmp_path, capsys):
    """The model card's code samples name the repository, and the push comes after the whole run."""
    train = script("train")
    monkeypatch.setattr(train, "train_run", lambda *args, **kwargs: pytest.fail("trained"))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--data", prepared_folder(tmp_path / "data"), "--model", "talk", "--output_dir",
                    str(tmp_path / "o"), "--max_steps", "1", "--push_to_hub", repo])
    assert exit_info.value.code == 2
    assert "--push_to_hub takes a repository id with its namespace, user/name or org/name" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ perplexity


def test_a_diverged_language_model_reports_infinite_perplexity_and_is_saved(tmp_path, monkeypatch):
    """A mean loss past log(max float) has an infinite perplexity, in the metrics log and the results alike, and the
    run saves its model."""
    from talk_hf.training import loop

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(line.replace("\t", " ") + "\n" for line in FIXTURE.read_text(encoding="utf-8")
                              .splitlines()), encoding="utf-8")
    script("preprocess").main(["--lm_text", f"train={corpus}", "--lm_holdout", "0.2", "--block_size", "16",
                               "--vocab_size", "200", "--output_dir", str(tmp_path / "data")])
    real = loop.summed_losses

    def diverged(*args, **kwargs):  # a mean validation and test loss of 800 nats
        sums = real(*args, **kwargs)
        sums.total = 800.0 * sums.tokens
        return sums

    monkeypatch.setattr(loop, "summed_losses", diverged)
    config = TrainConfig(output_dir=str(tmp_path / "lm"), max_tokens=256, max_steps=1, warmup_steps=1)
    tiny = dict(d_model=16, decoder_layers=1, decoder_ffn_dim=32, decoder_heads=2, decoder_max_offsets=[2])
    results = train_run(tmp_path / "data", "talk_lm", config, overrides=tiny, test_split="valid")
    assert results["valid_ppl"] == results["test_ppl"] == math.inf
    assert records(tmp_path / "lm")[-1]["valid_ppl"] == math.inf
    assert (tmp_path / "lm" / "model" / "model.safetensors").is_file()


# ------------------------------------------------------------------------------------------ the metrics log


def test_the_logged_learning_rate_is_the_one_each_update_used(data, tmp_path):
    """Update s of inverse_sqrt with warm-up w uses warmup_init_lr + (peak - warmup_init_lr) * s / w while s < w,
    then peak * sqrt(w / s) (fairseq's schedule, its first update at s = 1)."""
    run(data, tmp_path, max_steps=6, gradient_accumulation_steps=2)  # warm-up 2, peak 3e-3
    logged = {r["step"]: r["lr"] for r in records(tmp_path) if "lr" in r}
    expected = {s: 1e-7 + (3e-3 - 1e-7) * s / 2 if s < 2 else 3e-3 * math.sqrt(2 / s) for s in range(1, 7)}
    assert logged.keys() == expected.keys()
    assert all(logged[s] == pytest.approx(expected[s], rel=1e-9) for s in expected), (logged, expected)


class Killed(Exception):
    """The process ends here."""


def test_a_resumed_run_logs_each_update_once(data, tmp_path, monkeypatch):
    """A run killed at update 3 (its last checkpoint at 2, a last record cut off by the kill), then resumed, leaves
    the metrics log of an uninterrupted run."""
    run(data, tmp_path / "a", max_steps=5, save_every=2)
    after_update = Trainer.after_update

    def killed_at_3(self, *args):
        after_update(self, *args)
        if self.state.global_step == 3:
            raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(Trainer, "after_update", killed_at_3)
        with pytest.raises(Killed):
            run(data, tmp_path / "b", max_steps=5, save_every=2)
    with open(tmp_path / "b" / "metrics.jsonl", "a") as log:
        log.write('{"step": 3, "lo')
    assert [p.name for p in checkpoints(tmp_path / "b")] == ["step-2"]
    run(data, tmp_path / "b", max_steps=5, save_every=2, resume=True)
    assert records(tmp_path / "b") == records(tmp_path / "a")


# ------------------------------------------------------------------------------------------ the model's config


def test_a_resume_keeps_the_models_config(data, tmp_path):
    """run_settings.json records the model's config: a resume with another dropout is refused by name, the same
    model resumes."""
    run(data, tmp_path, max_steps=2)
    assert json.loads((tmp_path / "run_settings.json").read_text())["model"]["dropout"] == 0.2
    tokenizer, dataset = data
    config = TrainConfig(output_dir=str(tmp_path), max_tokens=256, learning_rate=3e-3, warmup_steps=2, log_every=1,
                         bleu_sentences=0, max_steps=3, resume=True)
    model = build_model("talk", tokenizer, overrides=dict(TINY, dropout=0.1))
    with pytest.raises(ValueError, match=r"other settings or data model\.dropout 0\.2 \(now 0\.1\)"):
        Trainer(model, tokenizer, dataset, dataset.select(range(16)), config).train()
    assert run(data, tmp_path, max_steps=3, resume=True).state.global_step == 3


# ------------------------------------------------------------------------------------------ results tables


def test_a_results_runner_tabulates_final_runs_without_patience(monkeypatch, tmp_path):
    """--patience 0: the final runs report no best update; the table shows "-" and the cap that ended them."""
    module = script("results_multi30k")

    def train_run_without_patience(data_dir, kind, config, **kwargs):
        assert config.patience == 0
        Path(config.output_dir).mkdir(parents=True)
        (Path(config.output_dir) / "metrics.jsonl").write_text('{"step": 4, "valid_loss": 2.0}\n')
        return {"model": kind, "parameters": 1e6, "train_minutes": 0.1, "steps": config.max_steps, "valid_loss": 2.0,
                "learning_rate": config.learning_rate, "warmup_steps": config.warmup_steps, "test_bleu": 1.0,
                "test_chrf": 2.0}

    monkeypatch.setattr(module, "train_run", train_run_without_patience)
    tables = module.main(["--data", prepared_folder(tmp_path / "data"), "--output_dir", str(tmp_path), "--rows",
                          "talk", "--stages", "final", "--setting", "1e-3", "2", "--patience", "0", "--max_steps", "4",
                          "--eval_every", "2"])
    assert "| talk | 0.001 | 2 | 1.00M | 4 | 0.1 | - | cap | - | 2.000 | 1.00 | 2.00 |" in tables["results.md"]
    assert (tmp_path / "results.md").read_text().strip() == tables["results.md"]


@pytest.mark.parametrize("runner", ["results_multi30k", "results_lm", "results_doc_zh_en"])
@pytest.mark.parametrize("flags, message", [
    (["--patience", "-1"], "patience=-1 needs patience >= 0"),
    (["--max_steps", "-5"], "max_steps must be >= 0, got -5"),
    (["--max_tokens", "0"], "max_tokens must be >= 1, got 0"),
    (["--grid_learning_rates", "-1"], "the grid's learning_rates must be distinct values > 0"),
])
def test_results_runners_refuse_settings_out_of_range_before_any_work(runner, flags, message, tmp_path, capsys):
    """A usage error at once, not a traceback after the data is prepared or the grid has trained."""
    module = script(runner)
    data = ["--data", prepared_folder(tmp_path / "data")] if runner == "results_multi30k" else []
    with pytest.raises(SystemExit) as exit_info:
        module.main([*data, "--output_dir", str(tmp_path / "out"), *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_multi30k_runner_refuses_a_folder_without_prepared_data(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        script("results_multi30k").main(["--data", str(tmp_path / "none"), "--output_dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and "is not a prepared data folder" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ averaging


def test_a_resumed_run_averages_the_checkpoints_an_uninterrupted_one_does(data, tmp_path, monkeypatch):
    """The resume point where the first part stopped validated lowest, so it is kept as the best checkpoint: it is
    not averaged in place of a scheduled one, by the run or by scripts/average_checkpoints.py."""
    losses = [5.0, 4.9, 4.8, 4.7, 4.6, 4.5, 4.0, 4.1, 4.2, 4.3]  # update 7 (a resume point) validates lowest
    settings = dict(save_every=2, eval_every=1, patience=5, keep_checkpoints=3, average_last=3)
    scripted_validation(monkeypatch, losses + [9.9])
    straight = run(data, tmp_path / "a", max_steps=10, **settings)
    scripted_validation(monkeypatch, losses[:7] + [9.9])
    run(data, tmp_path / "b", max_steps=7, **settings)
    scripted_validation(monkeypatch, losses[7:] + [9.9])
    resumed = run(data, tmp_path / "b", max_steps=10, resume=True, **settings)
    assert "step-7" in [p.name for p in checkpoints(tmp_path / "b")]  # kept: the best
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name
    resumed.save_model()
    averaged = script("average_checkpoints").main(["--run", str(tmp_path / "b"), "--last", "3", "--output",
                                                   str(tmp_path / "averaged")])
    by_script = load_file(str(Path(averaged) / "model.safetensors"))
    assert all(torch.equal(by_script[k], v) for k, v in load_file(str(tmp_path / "b" / "model" /
                                                                      "model.safetensors")).items())


def test_averaging_fewer_checkpoints_than_asked_warns(data, tmp_path):
    with pytest.warns(UserWarning, match=r"average_last=3, but the run has 2 checkpoint\(s\) to average"):
        run(data, tmp_path / "a", max_steps=3, save_every=2, keep_checkpoints=3, average_last=3)


def test_init_from_a_model_of_another_size_warns_before_training(prepared, tmp_path, monkeypatch):
    """Weights the folder does not hold keep their initialisation: said before training, not only in the results."""
    from transformers import AutoTokenizer

    from talk_hf.training import run as run_module

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    tokenizer = AutoTokenizer.from_pretrained(prepared / "tokenizer")
    build_model("talk", tokenizer, overrides=dict(TINY)).save_pretrained(tmp_path / "small")  # 1 + 1 layers
    monkeypatch.setattr(run_module, "Trainer", stop)
    config = TrainConfig(output_dir=str(tmp_path / "o"), max_steps=1)
    with pytest.warns(UserWarning, match=r"init_from .*small: \d+ of the model's weights are not in it"):
        with pytest.raises(Stop):
            larger = dict(TINY, encoder_layers=2, decoder_layers=2, encoder_max_offsets=[2, 2],
                          decoder_max_offsets=[3, 3])
            train_run(prepared, "talk", config, overrides=larger, init_from=tmp_path / "small")


def test_init_from_a_model_of_another_tokenizer_is_refused(prepared, tmp_path):
    """Ids prepared with one tokenizer and weights trained on another's (the same vocabulary size, so every shape
    matches): each embedding would belong to another token. Refused by name; the same tokenizer is taken."""
    from transformers import AutoTokenizer

    other = tmp_path / "lowercased"
    script("preprocess").main(["--tsv", f"train={FIXTURE}", "--tsv", f"valid={FIXTURE}", "--vocab_size", "200",
                               "--lowercase", "--output_dir", str(other)])
    theirs = AutoTokenizer.from_pretrained(other / "tokenizer")
    assert len(theirs) == len(AutoTokenizer.from_pretrained(prepared / "tokenizer"))
    model = build_model("talk", theirs, overrides=dict(TINY))
    model.save_pretrained(tmp_path / "m")
    theirs.save_pretrained(tmp_path / "m")
    config = TrainConfig(output_dir=str(tmp_path / "o"), max_tokens=512, max_steps=1, bleu_sentences=0)
    with pytest.raises(ValueError, match="^init_from .*m: its tokenizer is not the data's"):
        train_run(prepared, "talk", config, overrides=dict(TINY), init_from=tmp_path / "m")
    assert not (tmp_path / "o").exists()  # refused before training
    train_run(other, "talk", config, overrides=dict(TINY), init_from=tmp_path / "m")


def test_sentence_level_bleu_of_document_windows_is_refused_before_training(prepared, tmp_path):
    """A data folder of document windows (sentences joined by <sep>) trained without --document_level: its
    validation and test BLEU would score windows against hypotheses without separators. Refused before training."""
    import shutil

    import datasets

    windows = tmp_path / "windows"
    shutil.copytree(prepared, windows)
    valid = load_prepared(prepared, "valid")
    joined = [f"{a} <sep> {b}" for a, b in zip(valid["source"], valid["source"][1:] + valid["source"][:1])]
    rows = valid.remove_columns("source").add_column("source", joined)
    assert "doc_id" in rows.column_names
    shutil.rmtree(windows / "valid")
    datasets.Dataset.from_dict(rows.to_dict()).save_to_disk(str(windows / "valid"))
    config = TrainConfig(output_dir=str(tmp_path / "o"), max_tokens=512, max_steps=1, bleu_sentences=4)
    with pytest.raises(ValueError, match="^this split holds document windows"):
        train_run(windows, "talk", config, overrides=dict(TINY))
    assert not (tmp_path / "o").exists()


def test_a_language_models_test_limit_scores_the_first_rows(tmp_path):
    """`test_limit` N of a causal LM: the test perplexity is that of the split's first N rows, equal to the perplexity
    of a split holding only them, and the results record the split and the limit as they do for translation."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(line.replace("\t", " ") + "\n" for line in FIXTURE.read_text(encoding="utf-8")
                              .splitlines()), encoding="utf-8")
    script("preprocess").main(["--lm_text", f"train={corpus}", "--lm_holdout", "0.2", "--block_size", "16",
                               "--vocab_size", "200", "--output_dir", str(tmp_path / "data")])
    valid = load_prepared(tmp_path / "data", "valid")
    assert len(valid) > 3
    valid.select(range(3)).save_to_disk(str(tmp_path / "data" / "first3"))
    tiny = dict(d_model=16, decoder_layers=1, decoder_ffn_dim=32, decoder_heads=2, decoder_max_offsets=[2])

    def results(output, **kwargs):
        config = TrainConfig(output_dir=str(tmp_path / output), max_tokens=256, max_steps=1, warmup_steps=1)
        return train_run(tmp_path / "data", "talk_lm", config, overrides=tiny, **kwargs)

    limited, first3 = results("limited", test_split="valid", test_limit=3), results("first3", test_split="first3")
    assert (limited["test_split"], limited["test_limit"]) == ("valid", 3)
    assert limited["test_tokens"] == first3["test_tokens"]
    assert limited["test_loss"] == pytest.approx(first3["test_loss"], rel=1e-6)
    whole = results("whole", test_split="valid", test_limit=0)
    assert whole["test_limit"] == 0 and whole["test_tokens"] > limited["test_tokens"]
