"""One training run from a preprocessed data folder to a saved, evaluated, documented model (used by
scripts/train.py and scripts/demo.py)."""

import fcntl
import json
import os
import warnings
from pathlib import Path

from accelerate.utils import set_seed
from datasets import load_from_disk
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from ..document_translation import checked_documents, translate_document_streaming, translate_documents_counted
from ..environment import device_description
from ..metrics.document_bleu.document_bleu import document_scores
from ..tokenization import SEP_TOKEN, document_separator, split_sentences
from .corpora import group_documents, write_lines
from .evaluation import (
    corpus_bleu,
    corpus_chrf,
    generate_translations,
    last_sentences,
    perplexity,
    scoring,
    translate,
    warn_if_cut,
    window_last_sentences,
)
from .loop import Trainer, check_range, validation_loss
from .models import build_model, count_parameters
from .plot import plot_metrics


def load_prepared(data_dir, split):
    """A split written by scripts/preprocess.py (Dataset with input_ids, labels, num_tokens, source, target)."""
    path = Path(data_dir) / split
    if not path.exists():
        raise FileNotFoundError(f"no split {split!r} in {data_dir} (expected {path}); run scripts/preprocess.py")
    return load_from_disk(str(path))


def first_rows(dataset, limit):
    """The first `limit` rows of a Dataset or a dict of columns; all of it for 0."""
    if not limit:
        return dataset
    if hasattr(dataset, "select"):
        return dataset.select(range(min(limit, len(dataset))))
    return {k: v[:limit] for k, v in dataset.items()}


def evaluate_translation(model, tokenizer, dataset, num_beams=4, length_penalty=1.0, max_new_tokens=128,
                         document_level=False, limit=0, document_decoding="sliding"):
    """sacreBLEU and chrF of the model on a prepared split -> dict(bleu, signature, chrf, chrf_signature, sentences,
    hypotheses); `limit`: the first N rows only (0: all).

    document_level: the split holds document windows (scripts/preprocess.py --window; one row per sentence, its
    window ending with it). Its documents are translated whole, by `document_decoding`: "sliding" (the paper's
    sliding windows with the forced target context, window = the split's), "streaming" (the decoder state carried
    across each document; greedy) or "windows" (each window translated on its own, its last sentence kept;
    max_new_tokens limits the whole window, and the windows it cuts, whose last sentence may be a context sentence,
    are warned about and counted in `windows_cut`). Every sentence is scored once (`bleu`, `chrf`); `d_bleu` scores
    whole documents (metrics/document_bleu); a blank sentence's translation is "" (`translate_documents`). The
    model is put in eval mode (no dropout; RFA-doc's fixed random features)."""
    model.eval()
    dataset = first_rows(dataset, limit)
    generation = dict(num_beams=num_beams, length_penalty=length_penalty, max_new_tokens=max_new_tokens)
    if document_level:
        return _evaluate_documents(model, tokenizer, dataset, document_decoding, generation)
    refuse_document_windows(dataset, document_separator(tokenizer))
    hyps = translate(model, tokenizer, dataset["source"], **generation)
    references, options = scoring(tokenizer, dataset["target"])
    score, signature = corpus_bleu(hyps, references, **options)
    chrf, chrf_signature = corpus_chrf(hyps, references, lowercase=options["lowercase"])
    return {"bleu": score, "signature": signature, "chrf": chrf, "chrf_signature": chrf_signature,
            "sentences": len(hyps), "hypotheses": hyps}


def refuse_document_windows(dataset, sep_token):
    """Sentence-level scoring of a split of document windows (scripts/preprocess.py --window > 1: sources of several
    sentences joined by sep_token, the tokenizer's `document_separator`) would score windows against hypotheses
    whose separators are dropped (special tokens): refused, naming document-level evaluation."""
    if "doc_id" in getattr(dataset, "column_names", ()) and any(sep_token in s for s in dataset["source"]):
        raise ValueError(f"this split holds document windows (sentences joined by {sep_token}): score it with "
                         "document_level=True (scripts: --document_level), which translates and scores each "
                         "sentence of its documents")


DOCUMENT_DECODINGS = ("sliding", "streaming", "windows")


def _evaluate_documents(model, tokenizer, dataset, decoding, generation):
    if decoding not in DOCUMENT_DECODINGS:
        raise ValueError(f"document_decoding must be one of {DOCUMENT_DECODINGS}, got {decoding!r}")
    sep_token = document_separator(tokenizer)
    sources, references, window = split_documents(dataset, sep_token)
    shortened = cut = 0
    if decoding == "windows":
        generated = generate_translations(model, tokenizer, dataset["source"], **generation)
        cut = warn_if_cut(tokenizer, generated, stacklevel=4)  # the caller of evaluate_translation
        last = window_last_sentences(tokenizer, generated, sep_token)
        blank = [not sentence.strip() for doc in sources for sentence in doc]  # translated as "", as by the others
        hyps = group_documents(["" if b else h for b, h in zip(blank, last)], dataset["doc_id"])
    elif decoding == "streaming":
        if generation["num_beams"] != 1:
            raise ValueError("streaming document decoding is greedy: evaluate it with num_beams=1")
        hyps = [translate_document_streaming(model, tokenizer, doc, window=window, **generation) for doc in sources]
    else:
        hyps, shortened = translate_documents_counted(model, tokenizer, sources, window=window, **generation)
    flat_references, options = scoring(tokenizer, [s for doc in references for s in doc])
    sentences = iter(flat_references)
    references = [[next(sentences) for _ in doc] for doc in references]
    scores = document_scores(hyps, references, **options)
    flat = [s for doc in hyps for s in doc]
    chrf, chrf_signature = corpus_chrf(flat, flat_references, lowercase=options["lowercase"])
    return {"bleu": scores["bleu"], "d_bleu": scores["d_bleu"], "signature": scores["signature"],
            "chrf": chrf, "chrf_signature": chrf_signature,
            "sentences": scores["sentences"], "documents": scores["documents"], "window": window,
            "document_decoding": decoding, "context_shortened": shortened, "windows_cut": cut,
            "hypotheses": flat}


def split_documents(dataset, sep_token=SEP_TOKEN):
    """A split of document windows joined by `sep_token` -> (source documents, reference documents, window): each
    document the list of its sentences in order (the last sentence of each row's window; rows with the same
    consecutive doc_id form a document), window the most sentences any row's source window holds."""
    if "doc_id" not in dataset.column_names:
        raise ValueError("document-level evaluation needs a split of document windows with a doc_id column "
                         "(scripts/preprocess.py --window)")
    doc_ids = list(dataset["doc_id"])
    windows = [split_sentences(source, sep_token) for source in dataset["source"]]
    window = max([1, *map(len, windows)])
    for document in group_documents(list(zip(doc_ids, windows)), doc_ids):
        check_consecutive(document, window)
    sources = group_documents([(sentences or [""])[-1] for sentences in windows], doc_ids)
    return sources, group_documents(last_sentences(dataset["target"], sep_token), doc_ids), window


def check_consecutive(document, window):
    """document: [(doc_id, source window sentences)], one per row. Each row's context must be the sentences of the
    rows before it (as many as the window holds, blank ones left out, as `document_windows` makes them): a row
    dropped at preparation (e.g. by max_tokens_per_example) would otherwise join the sentences around it as one
    document, scored and decoded with the wrong context."""
    before = []  # the sentences before row k that are not blank (a blank one is no other row's context)
    for k, (doc_id, row) in enumerate(document):
        sentence = (row or [""])[-1]
        blank = not sentence.strip()
        expected = [] if blank or window == 1 else before[-(window - 1):]
        if not blank:
            before.append(sentence)
        if row[:-1] != expected:
            raise ValueError(f"document {doc_id!r}: row {k} has {len(row) - 1} context sentence(s) that are not the "
                             f"{len(expected)} sentence(s) before it: the split lost windows of this document (prepare "
                             "document-level evaluation splits with keep_all_splits, which refuses to drop one)")


def initialise_from(model, folder, tokenizer=None):
    """Copy the weights of the saved model in `folder` into `model` (e.g. a document-level model from its
    sentence-level run, or a gated RFA-doc from an ungated one) -> the names of `model`'s weights the folder does
    not hold (they keep their initialisation). A weight of the folder that `model` lacks, or of another shape, is a
    ValueError: the two models must be of one architecture; so is a tokenizer saved in the folder (as training runs
    save one) whose vocabulary is not `tokenizer`'s, the one the data was prepared with: an id's embedding would be
    another token's."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("model*.safetensors"))
    if not files:
        raise ValueError(f"init_from: no model*.safetensors in {folder}")
    saved = Path(folder) / "tokenizer.json"
    if tokenizer is not None and saved.exists():
        if Tokenizer.from_file(str(saved)).get_vocab(with_added_tokens=True) != tokenizer.get_vocab():
            raise ValueError(f"init_from {folder}: its tokenizer is not the data's (prepare the data with "
                             f"scripts/preprocess.py --tokenizer {folder}, so that each id is the token its "
                             "embedding was trained on)")
    source = {k: v for f in files for k, v in load_file(str(f)).items()}
    target = model.state_dict()
    unknown = sorted(k for k in source if k not in target)
    mismatched = sorted(k for k in source if k in target and source[k].shape != target[k].shape)
    if unknown or mismatched:
        raise ValueError(f"init_from {folder}: weights the model lacks {unknown[:5]}, of other shapes {mismatched[:5]}")
    model.load_state_dict(source, strict=False)
    loaded = {target[k].data_ptr() for k in source}  # a tied weight the file stores once is loaded with it
    return sorted(k for k in target if k not in source and target[k].data_ptr() not in loaded)


def final_weights(record):
    """What the final model's weights are, from their evaluation record: "last", "last N averaged" or "update N" (the
    best checkpoint of a run stopped by patience)."""
    if "best_checkpoint" in record:
        return f"update {record['best_checkpoint']}"
    n = record.get("averaged_checkpoints")
    return f"last {n} averaged" if n else "last"


def scored_split(test_split, test_limit, rows):
    """How a run records what its test scores are of: the split's name (`test_split`) and `test_limit`, the first
    rows scored when the limit leaves some of the split's `rows` out, else 0 (the whole split)."""
    return {"test_split": test_split, "test_limit": test_limit if 0 < test_limit < rows else 0}


CARD_KEY = "model_card"  # the results entry (eval_results.json) holding the model card's keyword arguments


def recorded_card(card):
    """`card` (train_run's model card keyword arguments) as JSON values, for the results: paths as strings."""
    return json.loads(json.dumps(card, default=str))


def card_arguments(results, card=None):
    """The keyword arguments of talk_hf.training.model_card.write_model_card (less metrics and training_args) that
    describe a run's model: `card` (default: the one its results record under CARD_KEY, as eval_results.json holds
    them), the run's init_from folder its base model where the card names none."""
    card = dict((results.get(CARD_KEY) or {}) if card is None else card)
    if card.get("base_model") is None and results.get("init_from") is not None:
        card["base_model"] = results["init_from"]
    return card


def write_run_card(folder, model, results, training_args, card):
    """The run's model card (README.md) in its model folder: `card`'s values (card_arguments), the results as its
    metrics."""
    from .model_card import write_model_card

    metrics = {key: value for key, value in results.items() if key != CARD_KEY}
    return write_model_card(folder, model=model, metrics=metrics, training_args=training_args,
                            **card_arguments(results, card))


def train_run(data_dir, kind, train_config, preset=None, config_file=None, overrides=None, train_split="train",
              valid_split="valid", test_split=None, document_level=False, card=None, test_limit=0, init_from=None):
    """Build, train, evaluate and save a model; returns the results dict (also written to eval_results.json).

    `test_split`: translated and scored (BLEU, chrF) for an encoder-decoder, its perplexity measured for a causal LM.
    The results record the split scored (`test_split`) and `test_limit` (scored_split).
    `card`: keyword arguments for talk_hf.training.model_card.write_model_card (languages, license, datasets ...),
    recorded in the results under CARD_KEY; None writes no card. `test_limit`: score only the first N test examples
    (0: all). `init_from`: a saved model folder whose weights start training (initialise_from), the card's base model
    where it names none. The model is initialised from train_config.seed: the same settings give the same run.
    """
    check_range("test_limit", test_limit, 0, why=" (0: every test example)")
    output_dir = Path(train_config.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(Path(data_dir) / "tokenizer")
    train, valid = load_prepared(data_dir, train_split), load_prepared(data_dir, valid_split)
    test = load_prepared(data_dir, test_split) if test_split else None  # a missing split fails before training
    if test is not None and document_level:  # a sentence holding the separator: refused before training
        checked_documents(split_documents(test)[0], tokenizer)
    if not document_level:  # the splits translated and scored sentence by sentence must hold sentences
        for split in ([valid] if train_config.bleu_sentences else []) + ([test] if test is not None else []):
            refuse_document_windows(split, document_separator(tokenizer))
    set_seed(train_config.seed)  # the initial weights (the Trainer seeds again for training)
    model = build_model(kind, tokenizer, preset=preset, config_file=config_file, overrides=overrides)
    kept_initialisation = initialise_from(model, init_from, tokenizer) if init_from is not None else None
    if kept_initialisation:
        warnings.warn(f"init_from {init_from}: {len(kept_initialisation)} of the model's weights are not in it and "
                      f"keep their initialisation ({', '.join(kept_initialisation[:4])}"
                      f"{', ...' if len(kept_initialisation) > 4 else ''}): a model of another size or layout is "
                      "trained partly from scratch", UserWarning, stacklevel=2)
    is_seq2seq = model.config.is_encoder_decoder
    valid_texts = (valid["source"], valid["target"]) if is_seq2seq and not document_level else None
    trainer = Trainer(model, tokenizer, train, valid, train_config, valid_texts=valid_texts)
    final = trainer.train()
    # the training time of the whole run, every process of a resumed one included (the state is checkpointed)
    results = {"model": kind, "parameters": count_parameters(model),
               "train_minutes": trainer.state.elapsed_seconds / 60,
               "steps": trainer.state.global_step, "valid_loss": final["valid_loss"],
               "num_processes": trainer.accelerator.num_processes, "learning_rate": train_config.learning_rate,
               "warmup_steps": train_config.warmup_steps, "max_tokens": train_config.max_tokens}
    if is_seq2seq:
        results["valid_source_gain"] = final["valid_source_gain"]
    if init_from is not None:
        results.update({"init_from": str(init_from), "not_initialised": kept_initialisation})
    if card is not None:
        results[CARD_KEY] = recorded_card(card)
    if train_config.patience:
        results.update({"best_step": trainer.state.best_step, "best_valid_loss": trainer.state.best_valid_loss,
                        "stopped_early": trainer.stopped_early(), "final_weights": final_weights(final),
                        "patience": train_config.patience,
                        "eval_every": train_config.eval_every})
    model = trainer.accelerator.unwrap_model(trainer.model)
    if is_seq2seq and test_split:
        scored = evaluate_translation(model, tokenizer, test, num_beams=train_config.num_beams,
                                      max_new_tokens=train_config.max_new_tokens, document_level=document_level,
                                      limit=test_limit)
        results.update({"test_bleu": scored["bleu"], "bleu_signature": scored["signature"],
                        "test_sentences": scored["sentences"], **scored_split(test_split, test_limit, len(test))})
        if "chrf" in scored:
            results.update({"test_chrf": scored["chrf"], "chrf_signature": scored["chrf_signature"]})
        if document_level:
            results.update({"test_d_bleu": scored["d_bleu"], "test_documents": scored["documents"],
                            "document_decoding": scored["document_decoding"], "window": scored["window"],
                            "test_context_shortened": scored["context_shortened"]})
        if trainer.accelerator.is_main_process:
            write_lines(output_dir / "test_hypotheses.txt", scored["hypotheses"])
    elif not is_seq2seq:
        results["valid_ppl"] = final["valid_ppl"]
        if test_split:
            loss, tokens = validation_loss(model, first_rows(test, test_limit), trainer.collator,
                                           train_config.max_tokens, trainer.accelerator)
            results.update({"test_loss": loss, "test_ppl": perplexity(loss), "test_tokens": tokens,
                            **scored_split(test_split, test_limit, len(test))})
    folder = trainer.save_model()
    if trainer.accelerator.is_main_process:
        (output_dir / "eval_results.json").write_text(json.dumps(results, indent=2) + "\n")
        plot_metrics(trainer.metrics_path, output_dir / "metrics.png")
        for name in ("eval_results.json", "metrics.jsonl", "metrics.png"):
            (folder / name).write_bytes((output_dir / name).read_bytes())
        if card is not None:
            write_run_card(folder, model, results, vars(train_config), card)
    return results


def record_result(results_path, row, key):
    """Add a result row (with the device) to the JSON list at `results_path`, replacing an earlier row with the same
    values of the `key` fields (a re-run replaces its row; the other rows stay). -> all rows, in file order.
    Processes writing the same file take turns (an exclusive lock on `<results_path>.lock`)."""
    results_path = Path(results_path)
    row = {**row, "device": device_description()}
    results_path.parent.mkdir(parents=True, exist_ok=True)
    # several runners may share one results file (rows trained in parallel): one writer at a time
    with open(results_path.with_name(results_path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        rows = json.loads(results_path.read_text()) if results_path.exists() else []
        rows = [r for r in rows if [r.get(k) for k in key] != [row[k] for k in key]] + [row]
        write_atomically(results_path, json.dumps(rows, indent=2) + "\n")
    return rows


def write_atomically(path, text):
    """Write `text` to `path` through a temporary file renamed over it: a reader (which takes no lock) or a process
    killed part-way never leaves a half-written file."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
