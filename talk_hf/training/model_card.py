"""Hub model cards (README.md) rendered from a training run's real values.

    from talk_hf.training.model_card import write_model_card
    write_model_card("runs/multi30k/talk/model", model, languages=["de", "en"], license="cc-by-nc-4.0",
                     datasets=["multi30k"], metrics={"test_bleu": 35.2, "valid_loss": 2.1},
                     training_args=vars(train_config), repo_id="me/talk-multi30k-de-en")

The templates are Jinja2 Markdown in ``talk_hf/training/templates/`` (package data): ``translation.md`` for
encoder-decoders, ``causal_lm.md`` for language models. They hold every sentence, table and code sample of the card;
this module gathers plain values (config entries, hyperparameters, results, flags) and renders a template with
``huggingface_hub.ModelCard.from_template`` (:func:`render_card`: a variable with no value is a ``ValueError`` naming
it). The YAML front matter is a ``ModelCardData`` (language, license, datasets, metrics, tags with ``talk_hf`` and the
model type, pipeline tag, ``model-index`` of ``EvalResult``) and must parse back from the rendered card unchanged.

``metrics``: a run's results dict, e.g. ``{"test_bleu": 35.2, "bleu_signature": "nrefs:1|...", "valid_loss": 2.1,
"valid_ppl": 8.2, "parameters": 9136, "steps": 20000}``. Keys ``[split_]metric`` with a known metric name (bleu,
sacrebleu, chrf, ter, loss, ppl/perplexity, accuracy, rouge1/2/L, meteor, comet) and a number become evaluation
results (table and ``model-index``); ``split`` is one of test/valid/validation/dev/eval/train (none: ``eval_split``).
A ``<split>_split`` string and a ``<split>_limit`` number (``train_run``'s ``test_split`` and ``test_limit``) say what
the ``<split>_`` results are of: the split scored (named in the table and ``model-index``) and how many of its first
rows (0: all); a result of the first N rows is not the split's result, and is in the table only (labelled so).
A ``<metric>_signature`` string (``bleu_signature``, ``chrf_signature``; a bare ``signature`` is BLEU's, as
``evaluate_translation`` returns it) is printed under the table, labelled with its metric; other numbers and strings
are listed as run statistics.

Unknown metadata is left out, never guessed: no ``languages`` writes no ``language`` field (the text names no
direction), no dataset writes no ``model-index`` (the results stay in the card's table), no ``repo_id`` puts
``MODEL_ID_PLACEHOLDER`` in the code samples, and a ``base_model`` that is a local folder (or not of the Hub's
``namespace/name`` form) is named in the text only, never as the ``base_model`` field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import jinja2
import jinja2.meta
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from .models import count_parameters

__all__ = ["MODEL_ID_PLACEHOLDER", "TEMPLATES_DIR", "fill_model_card", "hub_repo_id", "parse_metrics", "render_card",
           "template_path", "write_model_card"]

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"  # package data: found in installed packages too
TEMPLATES = {"translation": "translation.md", "causal_lm": "causal_lm.md"}

# model types whose code travels with the checkpoint (auto_map): loadable with trust_remote_code=True
TALK_HF_MODEL_TYPES = ("talk", "talk_lm", "dynamic_conv", "dynamic_conv_lm", "rfa_doc")

_METRIC_NAMES = {  # key as written by a run -> (model-index type, display name)
    "bleu": ("bleu", "BLEU"), "sacrebleu": ("bleu", "BLEU"), "chrf": ("chrf", "chrF"), "ter": ("ter", "TER"),
    "loss": ("loss", "loss (cross-entropy, nats/token)"), "ppl": ("perplexity", "perplexity"),
    "perplexity": ("perplexity", "perplexity"), "accuracy": ("accuracy", "accuracy"), "rouge1": ("rouge", "ROUGE-1"),
    "rouge2": ("rouge", "ROUGE-2"), "rougel": ("rouge", "ROUGE-L"), "meteor": ("meteor", "METEOR"),
    "comet": ("comet", "COMET"),
}
# what the code samples load when the card names no Hub repository
MODEL_ID_PLACEHOLDER = "<Hub repo id or local folder of this model>"
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_SPLITS = {"test": "test", "valid": "validation", "validation": "validation", "dev": "validation",
           "eval": "validation", "train": "train"}
# training_args keys never shown (local paths, resume flags, secrets)
_HIDDEN_ARGS = {"output_dir", "logging_dir", "resume", "resume_from_checkpoint", "overwrite_output_dir"}
# config fields shown in the model description table, in this order, when the config has them
_HIGHLIGHTS = (
    "vocab_size", "d_model", "n_embd", "encoder_layers", "decoder_layers", "n_layer", "encoder_ffn_dim",
    "decoder_ffn_dim", "n_inner", "encoder_heads", "decoder_heads", "encoder_conv_heads", "decoder_conv_heads",
    "encoder_attention_heads", "decoder_attention_heads", "n_head", "encoder_max_offsets", "decoder_max_offsets",
    "conv_type", "encoder_kernel_sizes", "decoder_kernel_sizes", "encoder_glu", "decoder_glu",
    "encoder_normalize_before", "decoder_normalize_before", "causal_num_frequencies", "cross_num_frequencies",
    "sentential_gate", "activation_function", "dropout", "max_position_embeddings", "tie_word_embeddings",
)


def template_path(template: str | Path | None = None, *, is_encoder_decoder: bool = True) -> Path:
    """The template file: a name in ``templates/`` ("translation", "causal_lm"), a path, or None (chosen by
    architecture)."""
    if template is None:
        template = "translation" if is_encoder_decoder else "causal_lm"
    path = TEMPLATES_DIR / TEMPLATES[str(template)] if str(template) in TEMPLATES else Path(template)
    if not path.is_file():
        raise FileNotFoundError(f"model card template {template!r} not found (looked for {path}; the templates ship in "
                                f"talk_hf/training/templates/)")
    return path


def render_card(template: str | Path, card_data: ModelCardData, **values) -> ModelCard:
    """``ModelCard.from_template`` after checking that every variable the template uses has a value (Jinja would
    render a missing one as empty text). Raises ValueError naming the missing variables."""
    path = Path(template)
    given = {"card_data", *card_data.to_dict(), *values, *jinja2.Environment().globals}  # what from_template passes
    used = jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(path.read_text(encoding="utf-8")))
    missing = sorted(used - given)
    if missing:
        raise ValueError(f"model card template {path} uses variables with no value: {', '.join(missing)}")
    return ModelCard.from_template(card_data, template_path=str(path), **values)


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


def _cells(items) -> list[tuple[str, str]]:
    """(name, value) pairs as the text of Markdown table cells (the templates put them in backticks)."""
    return [(name, (v if isinstance(v, str) else _fmt(v)).replace("|", "\\|").replace("`", "'")) for name, v in items]


def _number(value) -> float | int | None:
    """A finite Python number (numpy scalars and 0-d tensors included), else None."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    finite = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return value if finite else None


def _scopes(metrics: Mapping) -> tuple[dict[str, dict], set]:
    """What each prefix's results are of, from the ``<prefix>_split`` and ``<prefix>_limit`` entries (``test_split``,
    ``test_limit``, as ``train_run`` records them) -> (``{prefix: {"split": the split scored (default: the prefix),
    "limit": the first rows scored (0: all)}}``, the keys of these entries)."""
    scopes, keys = {}, set()
    for key, raw in metrics.items():
        head, _, tail = str(key).lower().partition("_")
        if head not in _SPLITS:
            continue
        if tail == "split" and isinstance(raw, str):
            value = raw
        elif tail == "limit" and _number(raw) is not None:
            value = int(_number(raw))
        else:
            continue
        scopes.setdefault(head, {"split": head, "limit": 0})[tail] = value
        keys.add(key)
    return scopes, keys


def parse_metrics(metrics: Mapping | None, eval_split: str = "test") -> tuple[list[dict], dict[str, str], dict]:
    """Split a run's results into (evaluation results, sacreBLEU signatures, other entries).

    Each evaluation result is ``{"key", "split", "type", "name", "value", "limit"}`` (``limit``: the result is of
    the split's first N rows, 0: of the whole split); the signatures are ``{metric display name: signature}``
    (``{"BLEU": ..., "chrF": ...}``); see the module docstring for the rules.
    """
    metrics = metrics or {}
    results, signatures, other = [], {}, {}
    scopes, scope_keys = _scopes(metrics)
    for key, raw in metrics.items():
        lowered = str(key).lower()
        if key in scope_keys:
            continue
        if lowered.endswith("signature") and isinstance(raw, str):
            signatures[_signature_name(key)] = raw
            continue
        split, metric = eval_split, lowered
        head, _, tail = lowered.partition("_")
        if tail and head in _SPLITS:
            split, metric = head, tail
        scope = scopes.get(split, {"split": split, "limit": 0})
        value = _number(raw)
        if metric in _METRIC_NAMES and value is not None:
            mtype, name = _METRIC_NAMES[metric]
            results.append({"key": key, "split": _SPLITS.get(scope["split"], scope["split"]), "type": mtype,
                            "name": name, "value": value, "limit": scope["limit"]})
        else:
            other[key] = raw
    return results, signatures, other


def _signature_name(key: str) -> str:
    """The metric a ``*signature`` key belongs to: "BLEU" for ``bleu_signature`` and a bare ``signature``, "chrF" for
    ``chrf_signature``; the key itself for a metric of no known name."""
    metric = str(key).lower().removesuffix("signature").rstrip("_") or "bleu"
    return _METRIC_NAMES[metric][1] if metric in _METRIC_NAMES else str(key)


def hub_repo_id(name: str | None) -> str | None:
    """``name`` when it can only be a Hub repository id (``namespace/name``, not an existing local path), else None."""
    if name is None or not _HUB_ID.fullmatch(str(name)) or Path(name).expanduser().exists():
        return None
    return str(name)


def _hyperparameters(training_args) -> dict:
    """The shown hyperparameters of a dict, dataclass or ``TrainingArguments`` (tokens already removed there)."""
    if training_args is None or isinstance(training_args, Mapping):
        args = dict(training_args or {})
    elif hasattr(training_args, "to_sanitized_dict"):
        args = training_args.to_sanitized_dict()
    else:
        args = dataclasses.asdict(training_args) if dataclasses.is_dataclass(training_args) else vars(training_args)
    hidden = {k for k, v in args.items() if k in _HIDDEN_ARGS or k.endswith("_token") or k == "token"
              or v is None or v == ""}
    return {k: (json.dumps(v if isinstance(v, dict) else sorted(v), sort_keys=True, default=str)
                if isinstance(v, (dict, set)) else v) for k, v in args.items() if k not in hidden}


def _card_data(config, task, run: dict, results: list[dict], eval_dataset, extra_tags) -> ModelCardData:
    """The YAML front matter, with a ``model-index`` entry per evaluation result when a dataset is named."""
    eval_name = eval_dataset or (run["datasets"][0] if run["datasets"] else None)
    direction = f" {run['source_language']}-{run['target_language']}" if run["languages"] else ""
    task_name = f"Translation{direction}" if task == "translation" else "Text generation"
    # a model-index entry needs its dataset, and is the whole split's result: without a dataset, and for the scores
    # of a split's first rows, the results are shown in the card's table only
    eval_results = [EvalResult(task_type=task, task_name=task_name, dataset_type=eval_name, dataset_name=eval_name,
                               dataset_split=r["split"], metric_type=r["type"],
                               metric_name=f"{r['name']} ({r['split']})", metric_value=r["value"])
                    for r in results if eval_name is not None and not r["limit"]]
    return ModelCardData(
        language=run["languages"] or None, license=run["license"], library_name="transformers",
        tags=list(dict.fromkeys(["talk_hf", config.model_type, task, *(t for t in extra_tags if t)])),
        datasets=run["datasets"] or None, metrics=sorted({r["type"] for r in results if r["type"] != "loss"}) or None,
        pipeline_tag=task, model_name=run["model_name"] if eval_results else None, eval_results=eval_results or None,
        base_model=hub_repo_id(run["base_model"]))


def _model_values(model) -> dict:
    """Template variables describing the model: class, parameters, config table rows, generation settings."""
    config, n_params = model.config, count_parameters(model)
    generation = getattr(model, "generation_config", None)
    return {
        "model_type": config.model_type, "model_class": type(model).__name__,
        "conv_type": getattr(config, "conv_type", None), "remote_code": config.model_type in TALK_HF_MODEL_TYPES,
        "vocab_size": f"{config.vocab_size:,}", "parameters": {"short": _human(n_params), "exact": f"{n_params:,}"},
        "config_rows": _cells((k, getattr(config, k)) for k in _HIGHLIGHTS
                              if k in config.to_dict() and getattr(config, k, None) is not None),
        "generation_rows": _cells((k, getattr(generation, k)) for k in ("num_beams", "max_new_tokens", "length_penalty")
                                  if getattr(generation, k, None) is not None),
    }


def fill_model_card(model, *, languages: Sequence[str] | str | None = (),
                    license: str | None = None,  # noqa: A002 - Hub field
                    datasets: Sequence[str] | str = (), metrics: Mapping | None = None, training_args=None,
                    dataset_description: str | None = None, template: str | Path | None = None,
                    repo_id: str | None = None, model_name: str | None = None, eval_split: str = "test",
                    eval_dataset: str | None = None, base_model: str | None = None,
                    extra_tags: Sequence[str] = ()) -> str:
    """The README.md text of a Hub model card for ``model``, its template rendered with the run's values.

    Args:
        model: the trained ``PreTrainedModel`` (its config, class and parameter count are described).
        languages: ISO 639-1 codes; for translation ``[source, target]`` (the direction shown in the card). Empty
            or None: unknown (no ``language`` field, no direction named).
        license: Hub license id (``"mit"``, ``"cc-by-nc-4.0"``, ...); None writes no license field and says so.
        datasets: Hub dataset ids or names the model was trained on; the first one names the evaluation set in
            ``model-index`` unless ``eval_dataset`` is given (with neither, the card has no ``model-index``).
        metrics: the run's results (see the module docstring); numbers under known metric names become the
            evaluation table and ``model-index``.
        training_args: dict (or dataclass / ``TrainingArguments``) of hyperparameters; paths, resume flags, tokens
            and None values are left out.
        dataset_description: prose for "Training data" (default: a sentence naming ``datasets``).
        template: "translation", "causal_lm", a path to a Jinja2 template, or None (by architecture).
        repo_id: the Hub repository id used in the code samples (default: ``MODEL_ID_PLACEHOLDER``).
        base_model: the model whose weights training started from: a Hub id (``namespace/name``) is also the
            ``base_model`` field; a local folder is named in the text only (:func:`hub_repo_id`).
        model_name: the card title and ``model-index`` name (default: last part of ``repo_id``, else
            ``<model_type>-<languages>``).

    Returns the card, YAML front matter included (it parses with ``huggingface_hub.ModelCard``). Raises ValueError
    for a template variable with no value or metadata that does not parse back from the card as written.
    """
    languages = [languages] if isinstance(languages, str) else list(languages or ())
    config, task = model.config, "translation" if model.config.is_encoder_decoder else "text-generation"
    model_name = model_name or (repo_id.split("/")[-1] if repo_id else "-".join([config.model_type, *languages[:2]]))
    results, signatures, other = parse_metrics(metrics, eval_split)
    base_model = None if base_model is None else str(base_model)
    run = {  # the template variables describing the run (the templates hold all the text)
        "model_name": model_name, "model_id": repo_id or MODEL_ID_PLACEHOLDER, "languages": languages,
        "source_language": languages[0] if languages else None,
        "target_language": languages[min(1, len(languages) - 1)] if languages else None,
        "license": license, "datasets": [datasets] if isinstance(datasets, str) else list(datasets or ()),
        "base_model": base_model, "base_model_on_hub": hub_repo_id(base_model) is not None,
        "dataset_description": (dataset_description or "").strip() or None,
        "hyperparameters": _cells(_hyperparameters(training_args).items()),
        "signature": signatures.get("BLEU"), "signatures": list(signatures.items()),
        "results": [{**r, "value": _fmt(r["value"])} for r in results],
        "statistics": _cells((k, v) for k, v in other.items() if _number(v) is not None or isinstance(v, str)),
    }
    card_data = _card_data(config, task, run, results, eval_dataset, extra_tags)
    card = render_card(template_path(template, is_encoder_decoder=config.is_encoder_decoder), card_data,
                       **run, **_model_values(model))
    if card.data.to_dict() != card_data.to_dict():
        raise ValueError(f"the rendered model card's metadata does not read back as written (does the template start "
                         f"with `---`, `{{{{ card_data }}}}`, `---`?): {card.data.to_dict()} != {card_data.to_dict()}")
    return str(card).rstrip("\n") + "\n"


def write_model_card(folder: str | Path, model, **kwargs) -> Path:
    """Fill a card (keyword arguments as for :func:`fill_model_card`) and write it as ``folder/README.md``, next to
    a model saved there with ``save_pretrained``. Returns the path written."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no model folder {folder}: save the model there first")
    path = folder / "README.md"
    path.write_text(fill_model_card(model, **kwargs), encoding="utf-8")
    return path
