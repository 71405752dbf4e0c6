"""Model cards: Jinja2 templates in talk_hf/training/templates/ rendered with huggingface_hub from a run's values, valid
Hub metadata, runnable usage code."""

import fnmatch
import importlib.resources
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from huggingface_hub import HfApi, ModelCard, ModelCardData
from transformers import GPT2Config, GPT2LMHeadModel, MarianConfig, MarianMTModel

from talk_hf import train_joint_bpe
from talk_hf.training.model_card import (MODEL_ID_PLACEHOLDER, TEMPLATES_DIR, fill_model_card, hub_repo_id,
                                         parse_metrics, render_card, template_path, write_model_card)
from tests.hub_server import local_hub  # noqa: F401  (pytest fixture import)
from tests.models.tiny import ALL, LM, SEQ2SEQ, make

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "multi30k_pairs.tsv"
SECTIONS = ["Model description", "Intended use", "Training data", "Training procedure", "Evaluation results",
            "How to use", "Limitations", "Citation"]
RESULTS = {  # what talk_hf.training.run.train_run returns
    "model": "talk", "parameters": 9136, "train_minutes": 1.25, "steps": 300, "valid_loss": 3.2114,
    "test_bleu": 35.2071, "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
    "test_sentences": 64,
}
ARGS = {"output_dir": "/secret/local/path", "learning_rate": 0.0007, "max_tokens": 4096, "warmup_steps": 4000,
        "label_smoothing": 0.1, "schedule": "inverse_sqrt", "resume": True, "hub_token": "hf_SECRET",
        "max_new_tokens": 128, "unused": None}


def sections(text):
    return re.findall(r"^## (.+)$", text, flags=re.M)


def section(text, title):
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def table_rows(text):
    return {tuple(c.strip() for c in line.strip("|").split("|")) for line in text.splitlines() if line.startswith("|")}


def code_blocks(text, language="python"):
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def n_params(model):
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def talk_card(**overrides):
    kwargs = dict(languages=["de", "en"], license="cc-by-nc-4.0", datasets=["bentrevett/multi30k"], metrics=RESULTS,
                  training_args=ARGS, dataset_description="The first 29,000 pairs of Multi30k task 1 (de-en).",
                  repo_id="user/talk-multi30k")
    kwargs.update(overrides)
    return fill_model_card(make("talk"), **kwargs)


def marian():
    return MarianMTModel(MarianConfig(vocab_size=60, d_model=16, encoder_layers=1, decoder_layers=1,
                                      encoder_ffn_dim=16, decoder_ffn_dim=16, encoder_attention_heads=2,
                                      decoder_attention_heads=2, decoder_start_token_id=2, pad_token_id=1))


def gpt2():
    return GPT2LMHeadModel(GPT2Config(vocab_size=60, n_embd=16, n_layer=1, n_head=2, n_positions=32, bos_token_id=0,
                                      eos_token_id=0))


def template_values(monkeypatch, model, **kwargs):
    """The card fill_model_card renders and the variables it passes to ModelCard.from_template."""
    calls = []
    original = ModelCard.from_template.__func__

    def spy(cls, card_data, template_path=None, template_str=None, **values):
        calls.append((card_data, Path(template_path), values))
        return original(cls, card_data, template_path, template_str, **values)

    monkeypatch.setattr(ModelCard, "from_template", classmethod(spy))
    text = fill_model_card(model, **kwargs)
    monkeypatch.undo()
    (call,) = calls
    return text, call


def test_templates_ship_with_their_sections():
    for name in ("translation.md", "causal_lm.md"):
        text = (TEMPLATES_DIR / name).read_text()
        assert text.startswith("---\n{{ card_data }}\n---\n")  # huggingface_hub's front matter idiom
        assert sections(text) == SECTIONS
        jinja2.Environment().parse(text)  # valid Jinja2


def test_templates_are_package_data():
    """Found through the installed package's resources, and covered by pyproject.toml's package-data globs."""
    tomllib = pytest.importorskip("tomllib")
    installed = importlib.resources.files("talk_hf.training") / "templates"
    assert {"translation.md", "causal_lm.md"} <= {f.name for f in installed.iterdir()}
    assert Path(str(installed)).resolve() == TEMPLATES_DIR
    assert template_path("causal_lm") == TEMPLATES_DIR / "causal_lm.md"
    assert template_path(is_encoder_decoder=True) == TEMPLATES_DIR / "translation.md"
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    globs = project["tool"]["setuptools"]["package-data"]["talk_hf.training"]
    for path in TEMPLATES_DIR.iterdir():
        assert any(fnmatch.fnmatch(f"templates/{path.name}", g) for g in globs), path.name
    assert any(re.match(r"jinja2\b", d, flags=re.I) for d in project["project"]["dependencies"])


# (model, template, kwargs): every template, with talk_hf and native architectures, all optional parts present / absent
RENDER_CASES = {
    "talk-full": (lambda: make("talk"), None, {}),
    "talk-empty": (lambda: make("talk"), None, dict(metrics=None, training_args=None, license=None, datasets=[],
                                                     dataset_description=None)),
    "rfa_doc-base": (lambda: make("rfa_doc"), "translation", dict(base_model="user/base", languages=["zh", "en"])),
    "marian": (marian, None, {}),
    "talk_lm-full": (lambda: make("talk_lm"), None, dict(languages=["en"])),
    "lightconv_lm-empty": (lambda: make("lightconv_lm"), "causal_lm", dict(metrics={}, training_args={})),
    "gpt2": (gpt2, None, dict(languages="en", datasets=["wikitext"])),
    # nothing known of the data, started from a local folder's weights, no repository
    "talk-unknown": (lambda: make("talk"), None, dict(languages=[], datasets=[], repo_id=None,
                                                      base_model=str(Path(__file__).parent))),
    "talk_lm-unknown": (lambda: make("talk_lm"), None, dict(languages=None, datasets=None, repo_id=None)),
}


@pytest.mark.parametrize("case", list(RENDER_CASES))
def test_every_template_renders_with_real_values_and_strict_undefined(case, monkeypatch):
    """The card equals a render of the same template with jinja2.StrictUndefined: no variable, attribute or key the
    template reads is missing in any branch taken (a typo would raise here)."""
    build, template, overrides = RENDER_CASES[case]
    model = build()
    model.generation_config.num_beams = 4
    kwargs = dict(languages=["de", "en"], license="mit", datasets=["multi30k"], metrics=RESULTS, training_args=ARGS,
                  repo_id="user/card", template=template)
    kwargs.update(overrides)
    text, (card_data, path, values) = template_values(monkeypatch, model, **kwargs)
    assert path.name == (template or ("translation" if model.config.is_encoder_decoder else "causal_lm")) + ".md"
    strict = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(path.read_text(encoding="utf-8"))
    expected = strict.render(card_data=card_data.to_yaml(), **{**card_data.to_dict(), **values})
    assert ModelCard(expected).text.strip() == ModelCard(text).text.strip()
    assert sections(text) == SECTIONS and not re.search(r"{{|}}|{%|%}|{#|#}", text)
    assert "``" not in text.replace("```", "") and "None" not in text  # no empty value, no unset value printed
    assert f"`{type(model).__name__}` (`model_type={model.config.model_type}`)" in text
    assert ("`num_beams`", "`4`") in table_rows(section(text, "Model description"))
    assert ('AutoModelForSeq2SeqLM' if model.config.is_encoder_decoder else 'AutoModelForCausalLM') in text
    if values["results"]:
        assert ("test", "BLEU", "35.21") in table_rows(section(text, "Evaluation results"))
    if values["hyperparameters"]:
        assert ("`learning_rate`", "`0.0007`") in table_rows(section(text, "Training procedure"))
    if kwargs.get("base_model") == "user/base":
        assert "fine-tuned from `user/base`" in text and ModelCard(text).data.base_model == "user/base"
    elif kwargs.get("base_model"):  # a local folder
        assert "saved in the local folder" in text and ModelCard(text).data.base_model is None


def test_a_missing_template_value_is_an_error_naming_it(monkeypatch, tmp_path):
    _, (card_data, path, values) = template_values(monkeypatch, make("talk"), languages=["de", "en"],
                                                   datasets=["multi30k"], metrics=RESULTS)
    for name in ("translation", "causal_lm"):
        partial = {k: v for k, v in values.items() if k not in ("model_id", "statistics")}
        with pytest.raises(ValueError, match=rf"{name}\.md uses variables with no value: model_id, statistics$"):
            render_card(TEMPLATES_DIR / f"{name}.md", card_data, **partial)
        assert render_card(TEMPLATES_DIR / f"{name}.md", card_data, **values).data.language == ["de", "en"]
    # None is a value (the templates test it): only absent names are errors
    assert "No evaluation results" in str(render_card(path, card_data, **{**values, "results": None}))
    # variables huggingface_hub passes itself count as given: card_data and the metadata fields
    own = tmp_path / "own.md"
    own.write_text("---\n{{ card_data }}\n---\n{{ license }} {{ language | join('/') }} {{ model_id }}\n")
    assert str(render_card(own, ModelCardData(language=["de"], license="mit"), model_id="x")).endswith("mit de x")
    with pytest.raises(ValueError, match="no value: model_id"):
        render_card(own, ModelCardData(language=["de"], license="mit"))


def test_card_loads_back_with_model_card_load(tmp_path):
    """The front matter read back from README.md with huggingface_hub.ModelCard.load."""
    model = make("lightconv")
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    write_model_card(folder, model, languages=["de", "en"], license="apache-2.0", datasets=["bentrevett/multi30k"],
                     metrics={"test_bleu": 31.4159, "test_chrf": 58.25, "valid_loss": 2.5, "steps": 10},
                     extra_tags=["lightweight-conv"], repo_id="user/light")
    data = ModelCard.load(folder / "README.md").data
    assert data.language == ["de", "en"] and data.license == "apache-2.0" and data.library_name == "transformers"
    assert data.datasets == ["bentrevett/multi30k"] and data.pipeline_tag == "translation"
    assert data.tags == ["talk_hf", "dynamic_conv", "translation", "lightweight-conv"]
    assert data.metrics == ["bleu", "chrf"] and data.model_name == "light"
    assert {(r.task_type, r.task_name, r.dataset_type, r.dataset_name, r.dataset_split, r.metric_type,
             r.metric_name, r.metric_value) for r in data.eval_results} == {
        ("translation", "Translation de-en", "bentrevett/multi30k", "bentrevett/multi30k", "test", "bleu",
         "BLEU (test)", 31.4159),
        ("translation", "Translation de-en", "bentrevett/multi30k", "bentrevett/multi30k", "test", "chrf",
         "chrF (test)", 58.25),
        ("translation", "Translation de-en", "bentrevett/multi30k", "bentrevett/multi30k", "validation", "loss",
         "loss (cross-entropy, nats/token) (validation)", 2.5)}


def test_translation_card_is_filled_from_the_run_and_parses_back():
    model = make("talk")
    text = talk_card()
    assert "{{" not in text and "}}" not in text and "{%" not in text
    assert sections(text) == SECTIONS

    card = ModelCard(text)
    data = card.data
    assert data.language == ["de", "en"] and data.license == "cc-by-nc-4.0"
    assert data.datasets == ["bentrevett/multi30k"] and data.metrics == ["bleu"]
    assert data.pipeline_tag == "translation" and data.library_name == "transformers"
    assert {"talk_hf", "talk", "translation"} <= set(data.tags)
    assert data.model_name == "talk-multi30k"
    results = {(r.dataset_split, r.metric_type): r for r in data.eval_results}
    assert set(results) == {("test", "bleu"), ("validation", "loss")}
    bleu = results[("test", "bleu")]
    assert bleu.metric_value == pytest.approx(35.2071) and bleu.task_type == "translation"
    assert bleu.dataset_type == "bentrevett/multi30k" and results[("validation", "loss")].metric_value == 3.2114

    description = section(text, "Model description")
    rows = table_rows(description)
    assert ("parameters", f"9.1K ({n_params(model):,}; tied weights counted once)") in rows
    assert ("architecture", "`TalkForConditionalGeneration` (`model_type=talk`)") in rows
    assert ("`encoder_max_offsets`", "`[1, 4]`") in rows and ("`decoder_heads`", "`4`") in rows
    assert "Time-aware Large Kernel" in text.split("## Model description")[0]
    assert "de → en" in text

    procedure = table_rows(section(text, "Training procedure"))
    assert ("`learning_rate`", "`0.0007`") in procedure and ("`max_tokens`", "`4,096`") in procedure
    assert ("`schedule`", "`inverse_sqrt`") in procedure
    for hidden in ("/secret/local/path", "hf_SECRET", "`resume`", "`unused`"):
        assert hidden not in text

    evaluation = section(text, "Evaluation results")
    assert ("test", "BLEU", "35.21") in table_rows(evaluation)
    assert ("validation", "loss (cross-entropy, nats/token)", "3.21") in table_rows(evaluation)
    assert RESULTS["bleu_signature"] in evaluation
    assert ("`steps`", "`300`") in table_rows(evaluation)
    assert section(text, "Training data").strip() == "The first 29,000 pairs of Multi30k task 1 (de-en)."

    with_pkg, without = code_blocks(section(text, "How to use"))
    assert "import talk_hf" in with_pkg and "trust_remote_code" not in with_pkg
    assert 'AutoModelForSeq2SeqLM.from_pretrained("user/talk-multi30k")' in with_pkg
    # with the package: the pipeline reuses the loaded model (the kernels' classes)
    assert 'pipeline("translation", model=model, tokenizer=tokenizer)' in with_pkg
    assert 'pipeline("translation", model="user/talk-multi30k", trust_remote_code=True)' in without
    assert "import talk_hf" not in without
    assert without.count("trust_remote_code=True") == 3  # model, tokenizer, pipeline
    assert "lioutas2020timeaware" in section(text, "Citation") and "elliott-etal-2016-multi30k" in text
    assert "License: `cc-by-nc-4.0`." in text


def test_causal_lm_card():
    model = make("talk_lm")
    text = fill_model_card(model, languages="en", license="mit", datasets=["wikitext"],
                           metrics={"valid_loss": 4.5, "valid_ppl": 90.017}, training_args={"learning_rate": 1e-3},
                           dataset_description="WikiText-2 (raw).", repo_id="user/talk-lm")
    data = ModelCard(text).data
    assert data.pipeline_tag == "text-generation" and data.language == ["en"]
    assert {"talk_hf", "talk_lm", "text-generation"} <= set(data.tags) and "translation" not in data.tags
    assert {(r.dataset_split, r.metric_type, r.metric_value) for r in data.eval_results} == {
        ("validation", "loss", 4.5), ("validation", "perplexity", 90.017)}
    assert data.metrics == ["perplexity"]
    assert sections(text) == SECTIONS and "{{" not in text
    assert "language model" in text.split("##")[0] and "translation" not in text.split("## How to use")[0].lower()
    with_pkg, without = code_blocks(section(text, "How to use"))
    assert 'AutoModelForCausalLM.from_pretrained("user/talk-lm")' in with_pkg
    assert 'pipeline("text-generation", model="user/talk-lm", trust_remote_code=True)' in without
    assert ("validation", "perplexity", "90.02") in table_rows(section(text, "Evaluation results"))


@pytest.mark.parametrize("name", list(ALL))
def test_every_model_class_gets_a_complete_card(name):
    model = make(name)
    text = fill_model_card(model, languages=["de", "en"], license="mit", datasets=["multi30k"],
                           metrics={"test_bleu": 1.5} if name in SEQ2SEQ else {"valid_ppl": 50.0},
                           training_args={"seed": 1})
    assert "{{" not in text and "}}" not in text
    data = ModelCard(text).data
    assert model.config.model_type in data.tags
    assert data.pipeline_tag == ("translation" if name in SEQ2SEQ else "text-generation")
    assert data.model_name == f"{model.config.model_type}-de-en" and len(data.eval_results) == 1
    assert f"`{type(model).__name__}`" in text and f"({n_params(model):,};" in text
    conv = getattr(model.config, "conv_type", None)
    if conv is not None:
        assert ("**lightweight convolutions**" if conv == "lightweight" else "**dynamic convolutions**") in text
    if name.startswith("rfa_doc"):
        assert '" <sep> ".join(' in text and ("`sentential_gate`", f"`{model.config.sentential_gate}`") in \
            table_rows(text)


def test_no_results_means_no_model_index():
    text = talk_card(metrics=None, training_args=None, dataset_description=None, license=None)
    data = ModelCard(text).data
    assert data.eval_results is None and data.metrics is None and data.license is None
    assert "model-index" not in text.split("\n---\n", 1)[0]
    assert "No evaluation results were recorded for this run." in text
    assert "The training hyperparameters were not recorded." in text
    assert "The model was trained on `bentrevett/multi30k`." in text
    assert "License: not specified by the authors." in text


def test_parse_metrics_rules():
    results, signatures, other = parse_metrics({"test_bleu": 30.0, "valid_chrf": 55.5, "bleu": 29.0, "eval_loss": 2,
                                                "dev_ter": 60.0, "valid_bleu": "n/a", "train_minutes": 3.0,
                                                "bleu_signature": "sig", "chrf_signature": "csig",
                                                "loss_scale": 1.0}, eval_split="test")
    assert [(r["split"], r["type"], r["value"]) for r in results] == [
        ("test", "bleu", 30.0), ("validation", "chrf", 55.5), ("test", "bleu", 29.0), ("validation", "loss", 2),
        ("validation", "ter", 60.0)]
    assert signatures == {"BLEU": "sig", "chrF": "csig"}
    assert parse_metrics({"signature": "s", "ter_signature": "t", "odd_signature": "o"})[1] == {
        "BLEU": "s", "TER": "t", "odd_signature": "o"}  # a bare signature is BLEU's (evaluate_translation's key)
    assert other == {"valid_bleu": "n/a", "train_minutes": 3.0, "loss_scale": 1.0}


def test_template_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.md"
    bad.write_text("---\n{{ card_data }}\n---\n# {{ model_name }}\n{{ not_a_field }} and {{ also_missing.x }}\n")
    with pytest.raises(ValueError, match="bad.md uses variables with no value: also_missing, not_a_field"):
        talk_card(template=bad)
    good = tmp_path / "short.md"  # an own template: the same variables as the shipped ones
    good.write_text("---\n{{ card_data }}\n---\n# {{ model_name }}\n{% for name, value in statistics %}\n"
                    "| `{{ name }}` | `{{ value }}` |\n{%- endfor %}\n")
    text = talk_card(template=good)
    assert text.splitlines()[-1] == "| `test_sentences` | `64` |" and ModelCard(text).data.model_name == "talk-multi30k"
    headless = tmp_path / "headless.md"  # no front matter: the metadata would be lost
    headless.write_text("# {{ model_name }}\n")
    with pytest.raises(ValueError, match="does not read back as written"):
        talk_card(template=headless)
    with pytest.raises(FileNotFoundError, match="nope.md"):
        talk_card(template=tmp_path / "nope.md")


def test_baseline_card_needs_no_remote_code():
    text = fill_model_card(marian(), languages=["de", "en"], license="mit", datasets=["multi30k"],
                           metrics=RESULTS, training_args={}, repo_id="user/marian")
    assert "{{" not in text
    assert {"talk_hf", "marian"} <= set(ModelCard(text).data.tags)
    with_pkg, without = code_blocks(section(text, "How to use"))
    assert "trust_remote_code" not in with_pkg + without and 'pipeline("translation", model="user/marian")' in with_pkg
    assert "import talk_hf" in with_pkg and "import talk_hf" not in without
    assert "vaswani2017attention" in text


def test_write_model_card_next_to_a_saved_model_as_train_run_calls_it(tmp_path):
    from talk_hf.training.loop import TrainConfig

    model = make("dynamic_conv")
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    config = TrainConfig(output_dir=str(tmp_path), max_steps=300, learning_rate=3e-4)
    card = {"languages": ["de", "en"], "datasets": ["multi30k"]}  # what scripts/train.py passes
    path = write_model_card(folder, model=model, metrics=RESULTS, training_args=vars(config), **card)
    assert path == folder / "README.md"
    loaded = ModelCard.load(path)
    assert loaded.data.language == ["de", "en"] and "dynamic_conv" in loaded.data.tags
    assert ("`max_steps`", "`300`") in table_rows(loaded.text) and str(tmp_path) not in loaded.text
    assert {p.name for p in folder.iterdir()} >= {"README.md", "config.json", "model.safetensors"}
    with pytest.raises(FileNotFoundError, match="save the model there first"):
        write_model_card(tmp_path / "missing", model=model, languages=["de"])


def test_usage_code_in_the_cards_runs_against_a_hub_repo(local_hub, tmp_path):
    """The "How to use" snippets of a translation and an LM card, pushed with their models, run as written: with
    talk_hf, and in a process where talk_hf cannot be imported."""
    texts = [t for line in FIXTURE.read_text(encoding="utf-8").splitlines() for t in line.split("\t")]
    snippets = {True: [], False: []}
    for name, repo, tok in (("talk", "user/card-mt", train_joint_bpe(texts, vocab_size=300)),
                            ("talk_lm", "user/card-lm", train_joint_bpe(texts, vocab_size=300, add_eos=False))):
        model = make(name, vocab_size=len(tok))
        folder = tmp_path / name
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        write_model_card(folder, model, languages=["de", "en"], license="mit", datasets=["multi30k"],
                         metrics={"test_bleu": 1.0} if name in SEQ2SEQ else {"valid_ppl": 60.0}, repo_id=repo)
        HfApi().create_repo(repo)
        HfApi().upload_folder(folder_path=folder, repo_id=repo)
        readme = ModelCard.load(repo).text  # back through the client
        with_pkg, without = code_blocks(section(readme, "How to use"))
        snippets[True].append(with_pkg)
        snippets[False].append(without)
    assert name in LM
    for installed in (True, False):
        prelude = "" if installed else "import sys\nsys.modules['talk_hf'] = None\n"
        code = prelude + "\n".join(snippets[installed])
        result = subprocess.run([sys.executable, "-c", code], env=local_hub.subprocess_env(tmp_path / str(installed)),
                                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (installed, result.stderr[-3000:])
        out = result.stdout
        assert "'translation_text'" in out and "'generated_text'" in out


def test_bleu_and_chrf_signatures_are_labelled_with_their_metric():
    """A run's results hold both signatures: each is printed under its own metric's name."""
    chrf_signature = "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0"
    text = talk_card(metrics={**RESULTS, "test_chrf": 55.1, "chrf_signature": chrf_signature})
    evaluation = section(text, "Evaluation results")
    assert f"sacreBLEU BLEU signature: `{RESULTS['bleu_signature']}`" in evaluation
    assert f"sacreBLEU chrF signature: `{chrf_signature}`" in evaluation
    assert evaluation.count("signature:") == 2


def test_unknown_languages_and_datasets_are_left_out():
    """No languages and no dataset (a run on data that names neither): no language, datasets or model-index
    metadata, no language direction in the text, the results in the card's table only."""
    text = fill_model_card(make("talk"), languages=[], datasets=[], metrics=RESULTS, training_args=ARGS)
    data = ModelCard(text).data
    assert data.language is None and data.datasets is None and data.eval_results is None
    assert data.metrics == ["bleu"] and "model-index" not in text.split("\n---\n", 1)[0]
    assert ("test", "BLEU", "35.21") in table_rows(section(text, "Evaluation results"))
    assert "→" not in text and "multi30k" not in text.lower() and "an unspecified corpus" in text
    assert text.splitlines()[text.splitlines().index("---", 1) + 2] == "# talk"
    lm = fill_model_card(make("talk_lm"), metrics={"valid_ppl": 50.0})
    assert ModelCard(lm).data.language is None and "A language model:" in lm


def test_a_local_base_model_folder_is_named_in_the_text_only(tmp_path):
    """Only a Hub id is the base_model metadata; a local folder (an --init_from run's) is named as one in the text."""
    folder = tmp_path / "runs" / "wiki1" / "model"
    folder.mkdir(parents=True)
    local = talk_card(base_model=str(folder))
    assert ModelCard(local).data.base_model is None and "trained from scratch" not in local
    assert f"fine-tuned from the weights saved in the local folder `{folder}` (not a Hub repository)" in local
    on_hub = talk_card(base_model="user/base")
    assert ModelCard(on_hub).data.base_model == "user/base" and "fine-tuned from `user/base`," in on_hub
    assert hub_repo_id("user/base") == "user/base" and hub_repo_id("runs/wiki1/model/") is None
    assert hub_repo_id(str(folder)) is None and hub_repo_id("base") is None and hub_repo_id(None) is None


def test_code_samples_without_a_repo_id_name_a_placeholder():
    """With no repo_id the code samples load a marked placeholder, not a repository named after the model."""
    text = talk_card(repo_id=None)
    assert ModelCard(text).data.model_name == "talk-de-en"
    for block in code_blocks(section(text, "How to use")):
        assert f'from_pretrained("{MODEL_ID_PLACEHOLDER}"' in block and '"talk-de-en"' not in block


def test_model_index_names_the_scored_split_and_leaves_out_a_limited_subset():
    """train_run records the split its test scores are of (test_split) and the first rows scored (test_limit, 0: the
    whole split): the card names that split in model-index, and a score of the first N sentences is in the table
    only, labelled so."""
    assert talk_card(metrics={**RESULTS, "test_split": "test", "test_limit": 0}) == talk_card()

    other = ModelCard(talk_card(metrics={**RESULTS, "test_split": "valid", "test_limit": 0}))
    assert {(r.dataset_split, r.metric_type) for r in other.data.eval_results} == {
        ("validation", "bleu"), ("validation", "loss")}
    assert ("validation", "BLEU", "35.21") in table_rows(section(other.text, "Evaluation results"))

    for split, name in (("test", "test"), ("valid", "validation")):
        text = talk_card(metrics={**RESULTS, "test_split": split, "test_limit": 4})
        data = ModelCard(text).data
        assert [(r.dataset_split, r.metric_type) for r in data.eval_results] == [("validation", "loss")]
        evaluation = section(text, "Evaluation results")
        assert (f"first 4 sentences of {name}", "BLEU", "35.21") in table_rows(evaluation)
        assert "not the split's result" in evaluation and "`test_limit`" not in evaluation
    results = parse_metrics({"test_bleu": 1.0, "test_split": "dev", "test_limit": 3, "valid_loss": 2.0})[0]
    assert [(r["split"], r["limit"]) for r in results] == [("validation", 3), ("validation", 0)]

    lm = fill_model_card(make("talk_lm"), datasets=["wikitext"], metrics={"test_ppl": 9.5, "test_limit": 2})
    assert ModelCard(lm).data.eval_results is None
    assert ("first 2 examples of test", "perplexity", "9.50") in table_rows(section(lm, "Evaluation results"))
