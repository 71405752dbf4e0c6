"""Evaluation: batched translation, sacreBLEU and chrF (with their signatures), ROUGE for summaries, perplexity for LMs,
and a document-level `compute_metrics` for transformers' Seq2SeqTrainer (RFA-doc windows)."""

import math

import numpy as np
import sacrebleu
import torch

from ..metrics.document_bleu.document_bleu import document_scores
from ..tokenization import SEP_TOKEN, split_sentences
from .corpora import group_documents


@torch.no_grad()
def translate(model, tokenizer, sources, num_beams=4, length_penalty=1.0, max_new_tokens=128, batch_size=64,
              skip_special_tokens=True, **generate_kwargs):
    """Translate `sources` (list of str) with beam search; sentences are batched by length, results keep the
    input order; `generate_kwargs` go to `model.generate`. -> list of str."""
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs = [None] * len(sources)
    for start in range(0, len(order), batch_size):
        index = order[start : start + batch_size]
        inputs = tokenizer([sources[i] for i in index], return_tensors="pt", padding=True).to(device)
        ids = model.generate(**inputs, num_beams=num_beams, length_penalty=length_penalty,
                             max_new_tokens=max_new_tokens, **generate_kwargs)
        texts = tokenizer.batch_decode(ids, skip_special_tokens=skip_special_tokens)
        for i, text in zip(index, texts):
            outputs[i] = text.strip()
    return outputs


def check_pairs(hypotheses, references):
    """Refuse hypotheses and references of different lengths, or none at all."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    if not hypotheses:
        raise ValueError("no hypotheses to score (an empty corpus has no BLEU or chrF)")


def corpus_bleu(hypotheses, references):
    """sacreBLEU over detokenised text -> (score, signature string as sacreBLEU prints it)."""
    check_pairs(hypotheses, references)
    metric = sacrebleu.metrics.BLEU()
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


def corpus_chrf(hypotheses, references):
    """sacreBLEU's chrF (character n-gram F-score, chrF2) over detokenised text -> (score, signature string)."""
    check_pairs(hypotheses, references)
    metric = sacrebleu.metrics.CHRF()
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


def last_sentences(texts, sep_token=SEP_TOKEN):
    """The current (last) sentence of each document window: the part scored at document-level evaluation."""
    return [(split_sentences(text, sep_token) or [""])[-1] for text in texts]


def document_metrics(tokenizer, doc_ids, sep_token=SEP_TOKEN):
    """A `compute_metrics` for transformers' Seq2SeqTrainer (predict_with_generate=True) on an evaluation set of
    document windows in document order: the last sentence of each generated window is that sentence's translation,
    the rows of one doc_id (consecutive) form a document, and the document_bleu scores come back as
    {"bleu", "d_bleu"}. doc_ids: the evaluation set's doc_id column, one per row."""
    doc_ids = list(doc_ids)

    def texts(ids):
        ids = np.where(ids != -100, ids, tokenizer.pad_token_id)
        return last_sentences(tokenizer.batch_decode(ids, skip_special_tokens=False), sep_token)

    def compute_metrics(prediction):
        hyps, refs = texts(generated_ids(prediction.predictions)), texts(prediction.label_ids)
        if len(hyps) != len(doc_ids):
            raise ValueError(f"{len(hyps)} predictions for an evaluation set of {len(doc_ids)} rows (doc_ids)")
        scores = document_scores(group_documents(hyps, doc_ids), group_documents(refs, doc_ids))
        return {"bleu": scores["bleu"], "d_bleu": scores["d_bleu"]}

    return compute_metrics


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
