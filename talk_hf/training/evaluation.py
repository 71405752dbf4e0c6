"""Evaluation: batched translation, sacreBLEU and chrF (with their signatures), ROUGE for summaries, perplexity for LMs,
and a document-level `compute_metrics` for transformers' Seq2SeqTrainer (RFA-doc windows)."""

import contextlib
import math
import re
import warnings

import numpy as np
import sacrebleu
import torch

from ..metrics.document_bleu.document_bleu import document_scores
from ..tokenization import SEP_TOKEN, document_separator, split_sentences, token_id
from .corpora import group_documents


@contextlib.contextmanager
def eval_mode(model):
    """The model in eval mode inside the block (no dropout; RFA-doc's fixed random features), and back in the mode
    it was in after it, whatever the block raised."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@torch.no_grad()
def generate_translations(model, tokenizer, sources, num_beams=4, length_penalty=1.0, max_new_tokens=128,
                          batch_size=64, **generate_kwargs):
    """Generate a translation of each of `sources` (list of str) with beam search; sentences are batched by length,
    results keep the input order; `generate_kwargs` go to `model.generate`, which returns one sequence of token ids
    per source whatever a generation config asks (num_return_sequences 1, return_dict_in_generate False; either as
    an argument is a ValueError). -> list of lists of token ids (the decoder start and any padding included). Runs
    in `eval_mode` (a training run's validation BLEU must not switch its dropout off)."""
    for name in ("num_return_sequences", "return_dict_in_generate"):
        if name in generate_kwargs:
            raise ValueError(f"{name}: generate_translations returns one sequence of token ids per source")
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs = [None] * len(sources)
    with eval_mode(model):
        for start in range(0, len(order), batch_size):
            index = order[start : start + batch_size]
            inputs = tokenizer([sources[i] for i in index], return_tensors="pt", padding=True).to(device)
            ids = model.generate(**inputs, num_beams=num_beams, length_penalty=length_penalty,
                                 max_new_tokens=max_new_tokens, num_return_sequences=1,
                                 return_dict_in_generate=False, **generate_kwargs)
            for i, row in zip(index, ids.tolist()):
                outputs[i] = row
    return outputs


def translate(model, tokenizer, sources, skip_special_tokens=True, **kwargs):
    """`generate_translations`, decoded -> list of str (stripped); a blank source's translation is "" (as
    scripts/translate.py and the document decodings give), not what the model makes of an empty input."""
    sources = list(sources)
    written = [k for k, source in enumerate(sources) if source.strip()]
    generated = generate_translations(model, tokenizer, [sources[k] for k in written], **kwargs) if written else []
    hyps = [""] * len(sources)
    for k, ids in zip(written, generated):
        hyps[k] = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens).strip()
    return hyps


def check_pairs(hypotheses, references):
    """Refuse hypotheses and references of different lengths, or none at all."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ValueError("no hypotheses to score (an empty corpus has no BLEU or chrF)")


def corpus_bleu(hypotheses, references, tokenize=None, lowercase=False):
    """sacreBLEU over detokenised text -> (score, signature string as sacreBLEU prints it); tokenize (default 13a)
    and lowercase: sacreBLEU's options (`scoring`)."""
    check_pairs(hypotheses, references)
    metric = sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase)
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


def corpus_chrf(hypotheses, references, lowercase=False):
    """sacreBLEU's chrF (character n-gram F-score, chrF2) over detokenised text -> (score, signature string);
    lowercase: case-insensitive."""
    check_pairs(hypotheses, references)
    metric = sacrebleu.metrics.CHRF(lowercase=lowercase)
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


# Han characters (CJK unified ideographs, extension A, compatibility ideographs): references holding any are scored
# with sacreBLEU's zh tokenizer, which splits them one by one (13a would read a Chinese sentence as a few tokens).
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def scoring(tokenizer, references):
    """What translations by a model with this tokenizer are scored against, so that a model that writes its labels
    scores 100 -> (references, {"tokenize", "lowercase"}: sacreBLEU's options).

    references: the texts as the tokenizer's normaliser writes them (talk_hf's joint BPE: NFKC, runs of whitespace
    made one space, lowercased on request), the only text its model can produce; as given for a tokenizer without
    a normaliser that maps text to text (the converted fairseq one; Gemma's and legacy Llama's, which write spaces
    as "▁"). lowercase: True when that normaliser lowercases (case-insensitive scores, `case:lc` in the
    signatures). tokenize: "zh" when a reference holds Han characters, else None (13a). fairseq-generate likewise
    scores against the references as preprocessed."""
    normalizer = getattr(getattr(tokenizer, "backend_tokenizer", None), "normalizer", None)
    if normalizer is not None and normalizer.normalize_str("a b") != "a b":
        normalizer = None  # not text to text: its output is the pre-tokenizer's input, not a text a model writes
    if normalizer is not None:
        references = [normalizer.normalize_str(text) for text in references]
    lowercase = normalizer is not None and normalizer.normalize_str("A") == "a"
    tokenize = "zh" if any(HAN.search(text) for text in references) else None
    return references, {"tokenize": tokenize, "lowercase": lowercase}


def last_sentences(texts, sep_token=SEP_TOKEN):
    """The current (last) sentence of each document window's text (e.g. a reference window of a prepared split):
    the part scored at document-level evaluation."""
    return [(split_sentences(text, sep_token) or [""])[-1] for text in texts]


def window_last_sentences(tokenizer, sequences, sep_token=None):
    """The current (last) sentence of each window of token ids (generated, or labels), decoded on its own: the ids
    after the window's last separator (`document_separator`), decoded with skip_special_tokens=True, so that each
    tokenizer keeps what its own decoding keeps (a converted fairseq tokenizer's <unk>) and detokenises the sentence
    as `translate_documents` does. sequences: rows of token ids -> list of str."""
    separator = token_id(tokenizer, document_separator(tokenizer, sep_token))
    sentences = []
    for row in sequences:
        ids = [int(i) for i in row]
        after = max((k for k, i in enumerate(ids) if i == separator), default=-1) if separator is not None else -1
        sentences.append(tokenizer.decode(ids[after + 1 :], skip_special_tokens=True).strip())
    return sentences


def document_metrics(tokenizer, doc_ids, sep_token=None):
    """A `compute_metrics` for transformers' Seq2SeqTrainer (predict_with_generate=True) on an evaluation set of
    document windows in document order: the last sentence of each generated window is that sentence's translation
    (`window_last_sentences`), the rows of one doc_id (consecutive) form a document, and the document_bleu scores
    come back as {"bleu", "d_bleu"}; generated windows without </s> are warned about (`warn_if_cut`). doc_ids: the
    evaluation set's doc_id column, one per row."""
    doc_ids = list(doc_ids)

    def texts(ids):
        return window_last_sentences(tokenizer, np.where(ids != -100, ids, tokenizer.pad_token_id), sep_token)

    def compute_metrics(prediction):
        generated = generated_ids(prediction.predictions)
        warn_if_cut(tokenizer, generated)
        hyps, refs = texts(generated), texts(prediction.label_ids)
        if len(hyps) != len(doc_ids):
            raise ValueError(f"{len(hyps)} predictions for an evaluation set of {len(doc_ids)} rows (doc_ids)")
        refs, options = scoring(tokenizer, refs)
        scores = document_scores(group_documents(hyps, doc_ids), group_documents(refs, doc_ids), **options)
        return {"bleu": scores["bleu"], "d_bleu": scores["d_bleu"]}

    return compute_metrics


def warn_if_cut(tokenizer, generated, stacklevel=3):
    """Warn when generated windows (rows of token ids, of one length or not, the decoder start first) hold no </s>
    after their start: the generation length limit cut them, and the last sentence of such a window, scored as its
    current one, may be a context sentence cut short. -> how many were cut (0 for a tokenizer without </s>).
    stacklevel: the warning's, as `warnings.warn` counts it from this function (3: the caller's caller)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        return 0
    cut = sum(not (np.asarray(row)[1:] == eos).any() for row in generated)
    if cut:
        warnings.warn(f"{cut} of {len(generated)} generated windows have no </s>: the generation length limit cut "
                      "them, and the last sentence scored for each may be a context sentence cut short rather than "
                      "the window's current one; raise generation_max_length (Seq2SeqTrainingArguments) or the "
                      "generation config's max_new_tokens", stacklevel=stacklevel)
    return cut


def generated_ids(predictions):
    """The token ids of a Seq2SeqTrainer's predictions, (rows, T) integers; anything else (the logits, a tuple of
    arrays, that it predicts without generating) is a ValueError."""
    if isinstance(predictions, tuple) or not np.issubdtype(np.asarray(predictions).dtype, np.integer):
        got = "a tuple" if isinstance(predictions, tuple) else f"{np.asarray(predictions).dtype} values"
        raise ValueError(f"document_metrics needs generated token ids (integers), got {got}: evaluate with "
                         "Seq2SeqTrainingArguments(predict_with_generate=True), whose predictions are the generated "
                         "ids rather than logits")
    return predictions


def rouge(summaries, references):
    """ROUGE-1/2/L F1 (x100) with the `rouge_score` package (pip install rouge-score), averaged over the pairs of
    `summaries` and `references` (two lists of one length; a length mismatch is a ValueError)."""
    summaries, references = list(summaries), list(references)
    if len(summaries) != len(references):
        raise ValueError(f"rouge: {len(summaries)} summaries for {len(references)} references")
    try:
        from rouge_score import rouge_scorer
    except ImportError as err:
        raise ImportError("ROUGE needs the rouge-score package: pip install rouge-score") from err
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    scores = [scorer.score(ref, hyp) for hyp, ref in zip(summaries, references)]
    return {k: 100 * sum(s[k].fmeasure for s in scores) / max(len(scores), 1) for k in ("rouge1", "rouge2", "rougeL")}


def perplexity(mean_loss):
    """exp of a token-level mean cross-entropy (natural log); inf past the largest float."""
    try:
        return math.exp(mean_loss)
    except OverflowError:
        return float("inf")
