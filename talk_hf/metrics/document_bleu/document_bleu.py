"""Document-level BLEU, an `evaluate` metric: translations of whole documents, scored sentence by sentence.

    import evaluate
    metric = evaluate.load(talk_hf.metrics.DOCUMENT_BLEU)    # a local path: works offline; can be pushed to the Hub
    metric.compute(predictions=[["A man rides.", "He waves."]], references=[["A man cycles.", "He waves."]])
    # {"bleu": ..., "d_bleu": ..., "documents": 1, "sentences": 2, "signature": "nrefs:1|case:mixed|..."}

predictions / references: one list of sentences per document, aligned sentence by sentence.
bleu: sacreBLEU corpus BLEU over every sentence of every document (each sentence scored once, with the context its
document gave it); d_bleu: BLEU over whole documents, each document's sentences joined by spaces as one segment
(n-grams may then cross sentence boundaries); signature: sacreBLEU's, for the sentence-level score.
"""

import datasets
import evaluate
import sacrebleu


def document_scores(predictions, references):
    """The metric's computation as a plain function (same arguments and result as `DocumentBleu.compute`)."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predicted documents but {len(references)} reference documents")
    for i, (pred, ref) in enumerate(zip(predictions, references)):
        if len(pred) != len(ref):
            raise ValueError(f"document {i}: {len(pred)} translated sentences but {len(ref)} reference sentences")
    sentences = [s for doc in predictions for s in doc]
    reference_sentences = [s for doc in references for s in doc]
    if not sentences:
        raise ValueError(f"no sentences to score ({len(predictions)} documents, none with a sentence)")
    metric = sacrebleu.metrics.BLEU()
    bleu = metric.corpus_score(sentences, [reference_sentences]).score
    d_bleu = sacrebleu.metrics.BLEU().corpus_score([" ".join(d) for d in predictions],
                                                   [[" ".join(d) for d in references]]).score
    return {"bleu": bleu, "d_bleu": d_bleu, "documents": len(predictions), "sentences": len(sentences),
            "signature": str(metric.get_signature())}


class DocumentBleu(evaluate.Metric):
    """Document-level BLEU (see the module docstring)."""

    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Post, 2018. A Call for Clarity in Reporting BLEU Scores (sacreBLEU).",
            inputs_description="predictions, references: lists (one per document) of sentences (str)",
            features=datasets.Features({
                "predictions": datasets.Sequence(datasets.Value("string")),
                "references": datasets.Sequence(datasets.Value("string")),
            }),
        )

    def _compute(self, predictions, references):
        return document_scores(predictions, references)
