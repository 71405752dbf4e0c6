"""Evaluation: batched translation, sacreBLEU (with its signature), ROUGE for summaries, perplexity for LMs,
and document-level scoring of the last sentence of each window (RFA-doc)."""

import math

import sacrebleu
import torch

from ..tokenization import split_sentences


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


def corpus_bleu(hypotheses, references):
    """sacreBLEU over detokenised text -> (score, signature string as sacreBLEU prints it)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    metric = sacrebleu.metrics.BLEU()
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


def last_sentences(texts, sep_token="<sep>"):
    """The current (last) sentence of each document window: the part scored at document-level evaluation."""
    return [(split_sentences(text, sep_token) or [""])[-1] for text in texts]


def rouge(summaries, references):
    """ROUGE-1/2/L F1 (x100) with the `rouge_score` package (pip install rouge-score)."""
    try:
        from rouge_score import rouge_scorer
    except ImportError as err:
        raise ImportError("ROUGE needs the rouge-score package: pip install rouge-score") from err
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    scores = [scorer.score(ref, hyp) for hyp, ref in zip(summaries, references)]
    return {k: 100 * sum(s[k].fmeasure for s in scores) / max(len(scores), 1) for k in ("rouge1", "rouge2", "rougeL")}


def perplexity(mean_loss):
    """exp of a token-level mean cross-entropy (natural log)."""
    return math.exp(mean_loss)
