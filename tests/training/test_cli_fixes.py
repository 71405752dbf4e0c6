"""The scripts' flags do what they say or are refused by name: train.py's usage errors, its model card metadata
(from the flags or the prepared data, never a default of another corpus), translate.py's generation settings, presets
of the baselines, demo.py's --vocab_size on an existing data folder, and the benchmarks' --device and dropout."""

import argparse
import gzip
import json
import types

import pytest
import torch
from huggingface_hub import ModelCard
from transformers import GenerationConfig

from talk_hf.training.model_card import MODEL_ID_PLACEHOLDER
from talk_hf.training.models import BASELINES, build_model_for_ids, check_preset

from .test_cli_inputs import IDS, prepared_folder
from .test_scripts import FIXTURE, script, small_generation_benchmark

TINY_LM = ["d_model=16", "decoder_layers=1", "decoder_ffn_dim=32", "decoder_heads=2", "decoder_max_offsets=[2]"]


def train_card(monkeypatch, tmp_path, prepared_args, *flags):
    """The card keyword arguments scripts/train.py gives train_run for data prepared with `prepared_args`."""
    train = script("train")
    calls = []
    monkeypatch.setattr(train, "train_run", lambda *args, **kwargs: calls.append(kwargs) or {})
    train.main(["--data", prepared_folder(tmp_path / "data", prepared_args), "--model", "talk", "--output_dir",
                str(tmp_path / "o"), "--max_steps", "1", *flags])
    return calls[0]["card"]


# ------------------------------------------------------------------------------------------ train.py usage errors


@pytest.mark.parametrize("flags, message", [
    (["--model", "talk"], "set at least one of max_steps, max_epochs and max_minutes"),
    (["--model", "talk", "--max_steps", "1", "--schedule", "linear"], "schedule must be one of"),
    (["--model", "transformer", "--max_steps", "1"], "argument --model: invalid choice: 'transformer'"),
    (["--model", "marian", "--max_steps", "1", "--preset", "iwslt-de-en"], "--preset: model kind 'marian' takes no"),
    (["--model", "talk", "--max_steps", "1", "--preset", "iwslt"], "--preset: unknown preset 'iwslt'"),
])
def test_train_refuses_bad_flags_with_a_usage_error(flags, message, monkeypatch, tmp_path, capsys):
    train = script("train")
    monkeypatch.setattr(train, "train_run", lambda *args, **kwargs: pytest.fail("trained despite a bad flag"))
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--data", prepared_folder(tmp_path / "data"), "--output_dir", str(tmp_path / "o"), *flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_train_refuses_a_data_folder_without_a_preparation(monkeypatch, tmp_path, capsys):
    train = script("train")
    monkeypatch.setattr(train, "train_run", lambda *args, **kwargs: pytest.fail("trained without data"))
    for folder in (tmp_path / "missing", tmp_path):
        with pytest.raises(SystemExit) as exit_info:
            train.main(["--data", str(folder), "--model", "talk", "--output_dir", str(tmp_path / "o"),
                        "--max_steps", "1"])
        assert exit_info.value.code == 2
        assert f"--data {folder} is not a prepared data folder (it has no preprocess.json)" in capsys.readouterr().err


def test_train_help_keeps_the_example_commands_on_their_own_lines(capsys):
    with pytest.raises(SystemExit):
        script("train").main(["--help"])
    lines = capsys.readouterr().out.splitlines()
    assert "    accelerate launch scripts/train.py ...            # several GPUs, through Accelerate" in lines
    assert any(line.startswith("    python scripts/train.py ... --resume ") for line in lines)


# ------------------------------------------------------------------------------------------ train.py model card


@pytest.mark.parametrize("prepared, languages, datasets", [
    ({"splits": [["train", "/c/train.de.gz", "/c/train.en.gz"], ["test", "test_2016_flickr.de", "test_2016_flickr.en"]]},
     ["de", "en"], []),
    ({"splits": [["train", "train.de", "train.en"]], "reverse": True}, ["en", "de"], []),
    ({"source_file": "corpus.fr", "target_file": "corpus.en", "splits": []}, ["fr", "en"], []),
    ({"splits": [["train", "a.de", "a.en"], ["test", "b.fr", "b.en"]]}, [], []),  # no one language pair
    ({"splits": [["train", "train.txt", "train.en"]]}, [], []),
    ({"hub_dataset": "bentrevett/multi30k", "source_lang": "de", "target_lang": "en"}, ["de", "en"],
     ["bentrevett/multi30k"]),
    ({"hub_dataset": "user/pairs", "source_lang": "src", "target_lang": "tgt"}, [], ["user/pairs"]),  # columns
    ({"wiki_zh_en": True, "reverse": True}, ["en", "zh"], []),
    ({"lm_text": [["train", "data/tinyshakespeare/input.txt.gz"]], "splits": []}, [], []),
    ({"tsv": [["train", "pairs.tsv"]], "splits": []}, [], []),
    ({"splits": ["train", "valid"], "vocab_size": 8000}, [], []),  # prepare_translation_data's own settings
])
def test_train_card_metadata_comes_from_the_prepared_data(prepared, languages, datasets, monkeypatch, tmp_path):
    """Languages and dataset as the preparation names them; none when it names none (never Multi30k de-en)."""
    card = train_card(monkeypatch, tmp_path, prepared)
    assert card["languages"] == languages and card["datasets"] == datasets
    assert card["license"] is None and card["base_model"] is None and "repo_id" not in card


def test_train_card_flags_name_languages_dataset_license_and_base_model(monkeypatch, tmp_path):
    prepared = {"hub_dataset": str(tmp_path), "source_lang": "de", "target_lang": "en"}  # a local dataset folder
    assert train_card(monkeypatch, tmp_path, prepared)["datasets"] == []
    monkeypatch.setattr("talk_hf.training.hub.push_run", lambda *args, **kwargs: "url")  # nothing was trained
    card = train_card(monkeypatch, tmp_path, prepared, "--languages", "cs", "en", "--dataset_name", "wmt/wmt16",
                      "--license", "cc-by-4.0", "--init_from", str(tmp_path / "base"), "--push_to_hub", "me/x")
    assert card == {"languages": ["cs", "en"], "datasets": ["wmt/wmt16"], "license": "cc-by-4.0",
                    "base_model": str(tmp_path / "base"), "repo_id": "me/x"}


def test_an_lm_trained_on_plain_text_gets_no_invented_metadata(tmp_path):
    """train.py on a plain-text LM corpus, end to end: the card names no language or dataset, states the --license,
    and its code samples load a marked placeholder (no --push_to_hub), not a repository named after the model."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(line.replace("\t", " ") + "\n" for line in FIXTURE.read_text(encoding="utf-8")
                              .splitlines()), encoding="utf-8")
    script("preprocess").main(["--lm_text", f"train={corpus}", "--lm_holdout", "0.2", "--block_size", "16",
                               "--vocab_size", "200", "--output_dir", str(tmp_path / "data")])
    script("train").main(["--data", str(tmp_path / "data"), "--model", "talk_lm", "--set", *TINY_LM, "--output_dir",
                          str(tmp_path / "lm"), "--max_tokens", "256", "--max_steps", "1", "--warmup_steps", "1",
                          "--license", "mit"])
    text = (tmp_path / "lm" / "model" / "README.md").read_text(encoding="utf-8")
    data = ModelCard(text).data
    assert data.language is None and data.datasets is None and data.license == "mit" and data.eval_results is None
    assert "multi30k" not in text.lower() and "de-en" not in text and "| validation | perplexity |" in text
    assert f'AutoModelForCausalLM.from_pretrained("{MODEL_ID_PLACEHOLDER}")' in text


# ------------------------------------------------------------------------------------------ presets


@pytest.mark.parametrize("kind", BASELINES)
def test_a_baseline_refuses_a_preset(kind):
    with pytest.raises(ValueError, match=rf"model kind '{kind}' takes no preset \(got 'iwslt-de-en'\)"):
        build_model_for_ids(kind, IDS, preset="iwslt-de-en", overrides=dict(d_model=16))


def test_an_unknown_preset_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match=r"unknown preset 'lm' for model kind 'talk'; choose one of \['base', "):
        check_preset("talk", "lm")
    check_preset("talk_lm", "lm")
    check_preset("marian", None)


# ------------------------------------------------------------------------------------------ translate.py


def test_translate_uses_the_models_saved_generation_settings_unless_flags_say_otherwise(tmp_path, monkeypatch):
    translate = script("translate")
    calls = []

    def translator(texts, **kwargs):
        calls.append(kwargs)
        return [{"translation_text": text} for text in texts]

    translator.model = types.SimpleNamespace(generation_config=GenerationConfig(num_beams=2, max_new_tokens=7,
                                                                                length_penalty=0.6))
    monkeypatch.setattr(translate, "pipeline", lambda *args, **kwargs: translator)
    source = tmp_path / "in.de"
    source.write_text("Ein Hund.\n", encoding="utf-8")
    translate.main(["--model", "m", "--input", str(source), "--output", str(tmp_path / "out.en")])
    translate.main(["--model", "m", "--input", str(source), "--output", str(tmp_path / "out.en"), "--num_beams", "5"])
    assert calls == [dict(batch_size=32, num_beams=2, length_penalty=0.6, max_new_tokens=7),
                     dict(batch_size=32, num_beams=5, length_penalty=0.6, max_new_tokens=7)]


def test_a_saved_max_length_limits_new_tokens_less_the_decoder_start():
    """Converted fairseq models save max_length (fairseq-generate's max_len_b + 2): 201 new tokens, not the 128 of a
    model that saved no limit; a saved max_new_tokens or a flag comes first."""
    settings = script("evaluate_model").generation_settings
    flags = types.SimpleNamespace(num_beams=None, length_penalty=None, max_new_tokens=None)
    assert settings(GenerationConfig(num_beams=5, max_length=202), flags)["max_new_tokens"] == 201
    assert settings(GenerationConfig(max_length=202, max_new_tokens=7), flags)["max_new_tokens"] == 7
    assert settings(GenerationConfig(num_beams=5), flags)["max_new_tokens"] == 128
    flags.max_new_tokens = 9
    assert settings(GenerationConfig(max_length=202), flags)["max_new_tokens"] == 9


# ------------------------------------------------------------------------------------------ demo.py


def test_demo_refuses_a_data_folder_of_another_vocab_size(tmp_path, monkeypatch, capsys):
    demo = script("demo")
    bundle = tmp_path / "multi30k"  # the bundled files' names, the fixture's pairs
    bundle.mkdir()
    pairs = [line.split("\t") for line in FIXTURE.read_text(encoding="utf-8").splitlines()]
    for stem in ("train", "val", "test_2016_flickr"):
        for side, language in enumerate(("de", "en")):
            with gzip.open(bundle / f"{stem}.{language}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(pair[side] + "\n" for pair in pairs))
    monkeypatch.setattr(demo, "DATA", bundle)
    monkeypatch.setattr(demo, "train_run", lambda *args, **kwargs: pytest.fail("trained on the wrong vocabulary"))
    demo.prepare(tmp_path / "out" / "data", 200)
    demo.prepare(tmp_path / "out" / "data", 200)  # prepared with these settings: kept
    with pytest.raises(SystemExit, match=r"demo.py: error: .*data was prepared with vocab_size=200 \(asked for 300\)"):
        demo.main(["--output_dir", str(tmp_path / "out"), "--vocab_size", "300"])


# ------------------------------------------------------------------------------------------ benchmarks


def test_generation_benchmark_streaming_rows_run_on_the_asked_device(monkeypatch):
    """--device moves the streaming rows' models (the "paper" size) there, as it does every other row's."""
    module = small_generation_benchmark(monkeypatch)
    monkeypatch.setattr(module, "PAPER_SIZE", dict(d_model=16, layers=1, heads=2, ffn=32))
    moved, models = [], module.models

    def recording_models(kind):
        built = models(kind)
        for model in built:
            to = model.to
            model.to = lambda device, _to=to, _kind=kind: moved.append((_kind, str(device))) or _to(device)
        return built

    monkeypatch.setattr(module, "models", recording_models)
    module.main(["--rows", "streaming", "--stream_sentences", "2", "--stream_window", "2", "--device", "cpu"])
    assert moved.count(("paper", "cpu")) == 2  # RFA-doc and Marian


def test_training_benchmark_models_have_no_dropout():
    module = script("benchmark_training")
    args = argparse.Namespace(d_model=16, layers=1, ffn=32, heads=2, lengths=[8], length=8)
    for kind in module.KINDS:
        config = module.build(kind, args).config
        rates = {name: value for name, value in config.to_dict().items() if name.endswith("dropout")}
        assert rates and all(value == 0 for value in rates.values()), (kind, rates)
