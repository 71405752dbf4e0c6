"""Hub model cards (README.md) filled from a training run's real values.

    from talk_hf.training.model_card import write_model_card
    write_model_card("runs/multi30k/talk/model", model, languages=["de", "en"], license="cc-by-nc-4.0",
                     datasets=["multi30k"], metrics={"test_bleu": 35.2, "valid_loss": 2.1},
                     training_args=vars(train_config), repo_id="me/talk-multi30k-de-en")

The templates live in ``talk_hf/training/templates/``, package data (``translation.md`` for encoder-decoders,
``causal_lm.md`` for language models). They are Markdown with ``{{ name }}`` fields; :func:`fill_model_card` fills
every field and fails if one is left. The YAML front matter is written by ``huggingface_hub.ModelCardData`` (language,
license, datasets, metrics, tags with ``talk_hf`` and the model type, pipeline tag, ``model-index`` when there are
results) and is parsed back with ``huggingface_hub.ModelCard`` before anything is returned.

``metrics``: a run's results dict, e.g. ``{"test_bleu": 35.2, "bleu_signature": "nrefs:1|...", "valid_loss": 2.1,
"valid_ppl": 8.2, "parameters": 9136, "steps": 20000}``. Keys ``[split_]metric`` with a known metric name (bleu,
sacrebleu, chrf, ter, loss, ppl/perplexity, accuracy, rouge1/2/L, meteor, comet) and a number become evaluation
results (table and ``model-index``); ``split`` is one of test/valid/validation/dev/eval/train (none: ``eval_split``).
A ``*signature`` string is printed under the table; other entries are listed as run statistics.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .models import count_parameters

__all__ = ["TEMPLATES_DIR", "fill_model_card", "parse_metrics", "template_path", "write_model_card"]

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"  # package data: found in installed packages too
TEMPLATES = {"translation": "translation.md", "causal_lm": "causal_lm.md"}
_FIELD = re.compile(r"{{\s*([A-Za-z_][A-Za-z0-9_]*)\s*}}")

# model types whose code travels with the checkpoint (auto_map): loadable with trust_remote_code=True
TALK_HF_MODEL_TYPES = ("talk", "talk_lm", "dynamic_conv", "dynamic_conv_lm", "rfa_doc")

_METRIC_NAMES = {  # key as written by a run -> (model-index type, display name)
    "bleu": ("bleu", "BLEU"), "sacrebleu": ("bleu", "BLEU"), "chrf": ("chrf", "chrF"), "ter": ("ter", "TER"),
    "loss": ("loss", "loss (cross-entropy, nats/token)"), "ppl": ("perplexity", "perplexity"),
    "perplexity": ("perplexity", "perplexity"), "accuracy": ("accuracy", "accuracy"), "rouge1": ("rouge", "ROUGE-1"),
    "rouge2": ("rouge", "ROUGE-2"), "rougel": ("rouge", "ROUGE-L"), "meteor": ("meteor", "METEOR"),
    "comet": ("comet", "COMET"),
}
_SPLITS = {"test": "test", "valid": "validation", "validation": "validation", "dev": "validation",
           "eval": "validation", "train": "train"}
# training_args keys never shown (local paths, resume flags, secrets)
_HIDDEN_ARGS = {"output_dir", "logging_dir", "resume", "resume_from_checkpoint", "overwrite_output_dir"}

_ARCHITECTURES = {
    "talk": "an encoder-decoder with **Time-aware Large Kernel (TaLK) convolutions** (Lioutas & Guo, ICML 2020) in "
            "place of self-attention: every token predicts how far its summation window reaches to the left and right, "
            "and the window is summed in O(1) per token from a summed-area table; the decoder attends to the encoder "
            "with multi-head attention",
    "talk_lm": "a decoder-only language model with causal **Time-aware Large Kernel (TaLK) convolutions** (Lioutas & "
               "Guo, ICML 2020): every token predicts how far back its summation window reaches",
    "dynamic_conv": "an encoder-decoder with **{conv} convolutions** (Wu et al., ICLR 2019) in place of "
                    "self-attention; the decoder attends to the encoder with multi-head attention",
    "dynamic_conv_lm": "a decoder-only language model with causal **{conv} convolutions** (Wu et al., ICLR 2019)",
    "rfa_doc": "a document-level encoder-decoder with **Random Feature Attention** (RFA, Peng et al., ICLR 2021), "
               "linear-time attention, and a sentential gate in the decoder (Wu et al., Findings of EMNLP 2022); it "
               "translates windows of consecutive sentences joined by ` <sep> `",
    "marian": "a Transformer encoder-decoder baseline (transformers `MarianMTModel`)",
    "bart": "a Transformer encoder-decoder baseline (transformers `BartForConditionalGeneration`)",
    "gpt2": "a Transformer decoder-only baseline (transformers `GPT2LMHeadModel`)",
}

_CITATIONS = {
    "talk": """@inproceedings{lioutas2020timeaware,
  title     = {Time-aware Large Kernel Convolutions},
  author    = {Lioutas, Vasileios and Guo, Yuhong},
  booktitle = {Proceedings of the 37th International Conference on Machine Learning (ICML)},
  series    = {Proceedings of Machine Learning Research},
  volume    = {119},
  pages     = {6172--6183},
  year      = {2020}
}""",
    "dynamic_conv": """@inproceedings{wu2019pay,
  title     = {Pay Less Attention with Lightweight and Dynamic Convolutions},
  author    = {Wu, Felix and Fan, Angela and Baevski, Alexei and Dauphin, Yann N. and Auli, Michael},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year      = {2019}
}""",
    "rfa": """@inproceedings{peng2021random,
  title     = {Random Feature Attention},
  author    = {Peng, Hao and Pappas, Nikolaos and Yogatama, Dani and Schwartz, Roy and Smith, Noah A. and
               Kong, Lingpeng},
  booktitle = {International Conference on Learning Representations (ICLR)},
  year      = {2021}
}""",
    "rfa_doc": """@inproceedings{wu-etal-2022-modeling,
  title     = {Modeling Context With Linear Attention for Scalable Document-Level Translation},
  author    = {Wu, Zhaofeng and Peng, Hao and Pappas, Nikolaos and Smith, Noah A.},
  booktitle = {Findings of the Association for Computational Linguistics: EMNLP 2022},
  pages     = {6931--6939},
  year      = {2022}
}""",
    "transformer": """@inproceedings{vaswani2017attention,
  title     = {Attention Is All You Need},
  author    = {Vaswani, Ashish and Shazeer, Noam and Parmar, Niki and Uszkoreit, Jakob and Jones, Llion and
               Gomez, Aidan N. and Kaiser, Lukasz and Polosukhin, Illia},
  booktitle = {Advances in Neural Information Processing Systems (NeurIPS)},
  year      = {2017}
}""",
    "multi30k": """@inproceedings{elliott-etal-2016-multi30k,
  title     = {Multi30K: Multilingual English-German Image Descriptions},
  author    = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  pages     = {70--74},
  year      = {2016}
}""",
}
_MODEL_CITATIONS = {"talk": ["talk"], "talk_lm": ["talk"], "dynamic_conv": ["dynamic_conv"],
                    "dynamic_conv_lm": ["dynamic_conv"], "rfa_doc": ["rfa_doc", "rfa"], "marian": ["transformer"],
                    "bart": ["transformer"], "gpt2": ["transformer"]}

_EXAMPLES = {
    "de": "Ein kleiner Hund läuft über eine grüne Wiese.",
    "en": "A small dog runs across a green meadow.",
    "fr": "Un petit chien court dans une prairie verte.",
    "cs": "Malý pes běží přes zelenou louku.",
    "ru": "Маленькая собака бежит по зелёному лугу.",
    "zh": "一只小狗跑过绿色的草地。",
}
_DOC_EXAMPLES = {
    "de": ["Ein Hund rennt über die Wiese.", "Er bellt laut."],
    "en": ["A dog runs across the meadow.", "It barks loudly."],
    "zh": ["一只狗跑过草地。", "它大声地叫。"],
}

# config fields shown in the "config highlights" table, in this order, when the config has them
_HIGHLIGHTS = (
    "vocab_size", "d_model", "n_embd", "encoder_layers", "decoder_layers", "n_layer", "encoder_ffn_dim",
    "decoder_ffn_dim", "n_inner", "encoder_heads", "decoder_heads", "encoder_conv_heads", "decoder_conv_heads",
    "encoder_attention_heads", "decoder_attention_heads", "n_head", "encoder_max_offsets", "decoder_max_offsets",
    "conv_type", "encoder_kernel_sizes", "decoder_kernel_sizes", "encoder_glu", "decoder_glu",
    "encoder_normalize_before", "decoder_normalize_before", "causal_num_frequencies", "cross_num_frequencies",
    "sentential_gate", "activation_function", "dropout", "max_position_embeddings", "tie_word_embeddings",
)


# --------------------------------------------------------------------------------------------------- helpers


def template_path(template: str | Path | None = None, *, is_encoder_decoder: bool = True) -> Path:
    """The template file: a name in ``templates/`` ("translation", "causal_lm"), a path, or None (chosen by
    architecture)."""
    if template is None:
        template = "translation" if is_encoder_decoder else "causal_lm"
    if str(template) in TEMPLATES:
        path = TEMPLATES_DIR / TEMPLATES[str(template)]
    else:
        path = Path(template)
    if not path.is_file():
        raise FileNotFoundError(f"model card template {template!r} not found (looked for {path}; the templates ship in "
                                f"talk_hf/training/templates/)")
    return path


def _human(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def _fmt(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.3g}"
        return f"{value:.2f}" if abs(value) >= 1 else f"{value:.4f}".rstrip("0").rstrip(".") or "0"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_fmt(v) if not isinstance(v, str) else v for v in value) + "]"
    return str(value)


def _cell(value) -> str:
    """A Markdown table cell: code-formatted, pipes escaped."""
    text = _fmt(value) if not isinstance(value, str) else value
    return "`" + text.replace("|", "\\|").replace("`", "'") + "`"


def _number(value) -> float | int | None:
    """A finite Python number (numpy scalars and 0-d tensors included), else None."""
    if isinstance(value, bool):
        return None
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if isinstance(value, (int, float)) and math.isfinite(value):
        return value
    return None


def parse_metrics(metrics: Mapping | None, eval_split: str = "test") -> tuple[list[dict], str | None, dict]:
    """Split a run's results into (evaluation results, sacreBLEU-style signature, other entries).

    Each evaluation result is ``{"key", "split", "type", "name", "value"}``; see the module docstring for the rules.
    """
    results, signature, other = [], None, {}
    for key, raw in (metrics or {}).items():
        lowered = str(key).lower()
        if lowered.endswith("signature") and isinstance(raw, str):
            signature = raw
            continue
        split, metric = eval_split, lowered
        head, _, tail = lowered.partition("_")
        if tail and head in _SPLITS:
            split, metric = head, tail
        value = _number(raw)
        if metric in _METRIC_NAMES and value is not None:
            mtype, name = _METRIC_NAMES[metric]
            results.append({"key": key, "split": _SPLITS.get(split, split), "type": mtype, "name": name,
                            "value": value})
        else:
            other[key] = raw
    return results, signature, other


def _as_dict(training_args) -> dict:
    if training_args is None:
        return {}
    if isinstance(training_args, Mapping):
        return dict(training_args)
    if hasattr(training_args, "to_sanitized_dict"):  # transformers TrainingArguments (tokens already removed)
        return training_args.to_sanitized_dict()
    if dataclasses.is_dataclass(training_args):
        return dataclasses.asdict(training_args)
    return dict(vars(training_args))


def _hyperparameters(training_args) -> dict:
    shown = {}
    for key, value in _as_dict(training_args).items():
        if key in _HIDDEN_ARGS or key.endswith("_token") or "token" == key or value is None or value == "":
            continue
        if isinstance(value, (dict, set)):
            value = json.dumps(value if isinstance(value, dict) else sorted(value), sort_keys=True, default=str)
        shown[key] = value
    return shown


def _table(header: tuple[str, ...], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _architecture(config) -> str:
    model_type = config.model_type
    text = _ARCHITECTURES.get(model_type)
    if text is None:
        return f"a `{model_type}` model"
    conv = "lightweight" if getattr(config, "conv_type", "dynamic") == "lightweight" else "dynamic"
    return text.format(conv=conv)


def _citation(config, datasets: Sequence[str]) -> str:
    keys = list(_MODEL_CITATIONS.get(config.model_type, []))
    keys += [name for name in ("multi30k",) if any(name in d.lower() for d in datasets)]
    if not keys:
        return "No citation is recorded for this architecture."
    return "```bibtex\n" + "\n\n".join(_CITATIONS[k] for k in keys) + "\n```"


# --------------------------------------------------------------------------------------------------- filling


def _usage_sections(*, config, model_id: str, source: str, pipeline_task: str) -> dict[str, str]:
    """Code blocks for "How to use": with talk_hf installed, and without it (remote code)."""
    seq2seq = config.is_encoder_decoder
    auto = "AutoModelForSeq2SeqLM" if seq2seq else "AutoModelForCausalLM"
    document = config.model_type == "rfa_doc"
    if seq2seq:
        if document:
            sentences = _DOC_EXAMPLES.get(source, _DOC_EXAMPLES["en"])
            text_line = f"text = \" <sep> \".join({sentences!r})  # one window of consecutive sentences"
        else:
            text_line = f"text = {_EXAMPLES.get(source, _EXAMPLES['en'])!r}"
        generate = ("ids = model.generate(**tokenizer([text], return_tensors=\"pt\"), num_beams=4, max_new_tokens=64)\n"
                    "print(tokenizer.batch_decode(ids, skip_special_tokens=True))")
        pipe = ("translator = pipeline(\"translation\", {source})\n"
                "print(translator(text, num_beams=4, max_new_tokens=64))")
    else:
        prompt = " ".join(_EXAMPLES.get(source, _EXAMPLES["en"]).split()[:3])
        text_line = f"text = {prompt!r}  # a prompt"
        generate = ("ids = model.generate(**tokenizer([text], return_tensors=\"pt\"), max_new_tokens=32, "
                    "do_sample=False)\nprint(tokenizer.batch_decode(ids, skip_special_tokens=True))")
        pipe = ("generator = pipeline(\"text-generation\", {source})\n"
                "print(generator(text, max_new_tokens=32, do_sample=False))")
    if config.model_type in TALK_HF_MODEL_TYPES:
        with_pkg = "\n".join([
            "import talk_hf  # registers the model classes" + (" and the translation pipeline" if seq2seq else "")
            + "; uses its compiled kernels",
            f"from transformers import {auto}, AutoTokenizer, pipeline",
            "",
            f"model = {auto}.from_pretrained(\"{model_id}\")",
            f"tokenizer = AutoTokenizer.from_pretrained(\"{model_id}\")",
            text_line, generate, "", pipe.replace("{source}", "model=model, tokenizer=tokenizer"),
        ])
        without = "\n".join([
            "# the repository carries the model code: no talk_hf install needed (pure PyTorch: slower than kernels)",
            f"from transformers import {auto}, AutoTokenizer, pipeline",
            "",
            f"model = {auto}.from_pretrained(\"{model_id}\", trust_remote_code=True)",
            f"tokenizer = AutoTokenizer.from_pretrained(\"{model_id}\", trust_remote_code=True)",
            text_line, generate, "", pipe.replace("{source}", f"model=\"{model_id}\", trust_remote_code=True"),
        ])
        without_intro = ("Without `talk_hf` installed, `trust_remote_code=True` runs the modeling code stored in this "
                         "repository (read it first; pin `revision=` to a commit you have read):")
    else:
        with_pkg = "\n".join([
            *(["import talk_hf  # transformers 5 removed the translation pipeline task; talk_hf registers it again"]
              if seq2seq else []),
            f"from transformers import {auto}, AutoTokenizer, pipeline",
            "",
            f"model = {auto}.from_pretrained(\"{model_id}\")",
            f"tokenizer = AutoTokenizer.from_pretrained(\"{model_id}\")",
            text_line, generate, "", pipe.replace("{source}", f"model=\"{model_id}\""),
        ])
        without = "\n".join([
            f"from transformers import {auto}, AutoTokenizer",
            "",
            f"model = {auto}.from_pretrained(\"{model_id}\")",
            f"tokenizer = AutoTokenizer.from_pretrained(\"{model_id}\")",
            text_line, generate,
        ])
        without_intro = ("This is a native transformers architecture: it loads without `talk_hf` and without "
                         "`trust_remote_code`" + (" (only the `translation` pipeline task needs `import talk_hf`):"
                                                  if seq2seq else ":"))
    return {"usage_with_talk_hf": f"```python\n{with_pkg}\n```", "usage_without_talk_hf_intro": without_intro,
            "usage_without_talk_hf": f"```python\n{without}\n```"}


def _render(template_text: str, fields: Mapping[str, str]) -> str:
    missing = sorted({m.group(1) for m in _FIELD.finditer(template_text)} - set(fields))
    if missing:
        raise ValueError(f"model card template has fields with no value: {', '.join(missing)}")
    text = _FIELD.sub(lambda m: fields[m.group(1)], template_text)
    left = re.findall(r"{{.*?}}|{%.*?%}", text)
    if left:
        raise ValueError(f"model card still has template placeholders after filling: {left[:5]}")
    return text


def fill_model_card(
    model,
    *,
    languages: Sequence[str] | str,
    license: str | None = None,  # noqa: A002 - the Hub metadata field's name
    datasets: Sequence[str] | str = (),
    metrics: Mapping | None = None,
    training_args=None,
    dataset_description: str | None = None,
    template: str | Path | None = None,
    repo_id: str | None = None,
    model_name: str | None = None,
    eval_split: str = "test",
    eval_dataset: str | None = None,
    base_model: str | None = None,
    extra_tags: Sequence[str] = (),
) -> str:
    """The README.md text of a Hub model card for ``model``, from the template filled with the run's values.

    Args:
        model: the trained ``PreTrainedModel`` (its config, class and parameter count are described).
        languages: ISO 639-1 codes; for translation ``[source, target]`` (the direction shown in the card).
        license: Hub license id (``"mit"``, ``"cc-by-nc-4.0"``, ...); None writes no license field and says so.
        datasets: Hub dataset ids or names the model was trained on; the first one names the evaluation set in
            ``model-index`` unless ``eval_dataset`` is given.
        metrics: the run's results (see the module docstring); numbers under known metric names become the
            evaluation table and ``model-index``.
        training_args: dict (or dataclass / ``TrainingArguments``) of hyperparameters; paths, resume flags, tokens
            and None values are left out.
        dataset_description: prose for "Training data" (default: a sentence naming ``datasets``).
        template: "translation", "causal_lm", a path to a template, or None (by architecture).
        repo_id: the Hub repository id used in the code samples (default: ``model_name``).
        model_name: the card title and ``model-index`` name (default: last part of ``repo_id``, else
            ``<model_type>-<languages>``).

    Returns:
        str: the card, YAML front matter included; it parses with ``huggingface_hub.ModelCard``.

    Raises:
        ValueError: a template field is left unfilled, evaluation results without any dataset name, or metadata that
            ``ModelCard`` cannot parse back.
    """
    config = model.config
    seq2seq = bool(config.is_encoder_decoder)
    languages = [languages] if isinstance(languages, str) else list(languages)
    datasets = [datasets] if isinstance(datasets, str) else list(datasets)
    if not languages:
        raise ValueError("languages must name at least one language")
    task = "translation" if seq2seq else "text-generation"
    lang_part = "-".join(languages[:2])
    model_name = model_name or (repo_id.split("/")[-1] if repo_id else f"{config.model_type}-{lang_part}")
    model_id = repo_id or model_name
    source, target = languages[0], languages[1] if len(languages) > 1 else languages[0]

    results, signature, other = parse_metrics(metrics, eval_split)
    eval_name = eval_dataset or (datasets[0] if datasets else None)
    if results and eval_name is None:
        raise ValueError("metrics have evaluation results but no dataset is named: pass datasets= or eval_dataset=")
    task_name = f"Translation {source}-{target}" if seq2seq else "Text generation"
    eval_results = [
        EvalResult(task_type=task, task_name=task_name, dataset_type=eval_name, dataset_name=eval_name,
                   dataset_split=r["split"], metric_type=r["type"], metric_name=f"{r['name']} ({r['split']})",
                   metric_value=r["value"])
        for r in results
    ] or None
    tags = ["talk_hf", config.model_type, task, *(t for t in extra_tags if t)]
    tags = list(dict.fromkeys(tags))
    card_data = ModelCardData(
        language=languages, license=license, library_name="transformers", tags=tags, datasets=datasets or None,
        metrics=sorted({r["type"] for r in results if r["type"] != "loss"}) or None, pipeline_tag=task,
        model_name=model_name if eval_results else None, eval_results=eval_results, base_model=base_model,
    )

    n_params = count_parameters(model)
    highlights = [(f"`{k}`", _cell(getattr(config, k))) for k in _HIGHLIGHTS
                  if k in config.to_dict() and getattr(config, k, None) is not None]
    rows = [("architecture", f"`{type(model).__name__}` (`model_type={config.model_type}`)"),
            ("parameters", f"{_human(n_params)} ({n_params:,}; tied weights counted once)"), *highlights]
    hyper = _hyperparameters(training_args)
    gen = getattr(model, "generation_config", None)
    gen_rows = [(f"`{k}`", _cell(getattr(gen, k))) for k in ("num_beams", "max_new_tokens", "length_penalty")
                if gen is not None and getattr(gen, k, None) is not None]

    if results:
        results_text = _table(("split", "metric", "value"),
                              [(r["split"], r["name"], _fmt(r["value"])) for r in results])
        if signature:
            results_text += f"\n\nsacreBLEU signature: `{signature}`"
    else:
        results_text = "No evaluation results were recorded for this run."
    stats = [(f"`{k}`", _cell(v)) for k, v in other.items() if _number(v) is not None or isinstance(v, str)]
    if stats:
        results_text += "\n\nRun statistics:\n\n" + _table(("entry", "value"), stats)

    dataset_list = ", ".join(f"`{d}`" for d in datasets) or "an unspecified corpus"
    limitations = [
        f"- Trained only on {dataset_list}: expect much lower quality on text from other domains, registers or "
        "lengths than the training data.",
        f"- The vocabulary has {config.vocab_size:,} entries: text unlike the training data (other scripts, rare "
        "words) splits into many rare sub-words and is handled poorly.",
    ]
    if config.model_type == "rfa_doc":
        limitations.append("- Input is a window of consecutive sentences joined by ` <sep> ` (`talk_hf.tokenization."
                           "join_sentences`); single sentences work but use no context.")
    if config.model_type in TALK_HF_MODEL_TYPES:
        limitations.append("- With `trust_remote_code=True` and no `talk_hf` install the layers run their pure-PyTorch "
                           "reference path, which is slower than the compiled kernels.")
    limitations.append("- Outputs are not filtered: the model can reproduce biases and errors of its training data.")

    fields = {
        "card_data": card_data.to_yaml(),
        "model_name": model_name,
        "model_id": model_id,
        "model_type": config.model_type,
        "model_class": type(model).__name__,
        "architecture": _architecture(config),
        "num_parameters": f"{_human(n_params)} ({n_params:,})",
        "source_language": source,
        "target_language": target,
        "languages": ", ".join(f"`{lang}`" for lang in languages),
        "license_text": f"`{license}`" if license else "not specified by the authors",
        "highlights_table": _table(("", "config"), rows),
        "dataset_list": dataset_list,
        "dataset_description": (dataset_description or f"The model was trained on {dataset_list}.").strip(),
        "hyperparameters_table": (_table(("hyperparameter", "value"), [(f"`{k}`", _cell(v)) for k, v in hyper.items()])
                                  if hyper else "The training hyperparameters were not recorded."),
        "generation_table": (_table(("generation setting", "value"), gen_rows) if gen_rows
                             else "The repository uses transformers' default generation settings."),
        "results": results_text,
        "training_origin": (f"The model was fine-tuned from `{base_model}`" if base_model
                            else "The model was trained from scratch (no pre-trained weights)"),
        "limitations": "\n".join(limitations),
        "citation": _citation(config, datasets),
        **_usage_sections(config=config, model_id=model_id, source=source, pipeline_task=task),
    }
    path = template_path(template, is_encoder_decoder=seq2seq)
    text = _render(path.read_text(encoding="utf-8"), fields)
    _check_front_matter(text, languages=languages, license=license, pipeline_tag=task, tags=tags,
                        n_results=len(results))
    return text


def _check_front_matter(text: str, *, languages, license, pipeline_tag, tags, n_results) -> None:  # noqa: A002
    """Parse the card back with huggingface_hub and compare the metadata with what was meant."""
    try:
        data = ModelCard(text).data
    except Exception as exc:  # ModelCard raises ValueError for a bad header / model-index
        raise ValueError(f"the filled model card does not parse as a Hub model card: {exc}") from exc
    problems = []
    if data.language != languages:
        problems.append(f"language {data.language} != {languages}")
    if data.license != license:
        problems.append(f"license {data.license} != {license}")
    if data.pipeline_tag != pipeline_tag:
        problems.append(f"pipeline_tag {data.pipeline_tag} != {pipeline_tag}")
    if not set(tags) <= set(data.tags or []):
        problems.append(f"tags {data.tags} miss some of {tags}")
    if len(data.eval_results or []) != n_results:
        problems.append(f"{len(data.eval_results or [])} model-index results instead of {n_results}")
    if problems:
        raise ValueError("the filled model card's metadata does not read back as written: " + "; ".join(problems))


def write_model_card(folder: str | Path, model, **kwargs) -> Path:
    """Fill a card (keyword arguments as for :func:`fill_model_card`) and write it as ``folder/README.md``, next to
    a model saved there with ``save_pretrained``. Returns the path written."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no model folder {folder}: save the model there first")
    text = fill_model_card(model, **kwargs)
    path = folder / "README.md"
    path.write_text(text, encoding="utf-8")
    return path
