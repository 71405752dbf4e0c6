"""Document-level BLEU, an `evaluate` metric: translations of whole documents, scored sentence by sentence.

    import evaluate
    metric = evaluate.load(talk_hf.metrics.DOCUMENT_BLEU)    # a local path: works offline; can be pushed to the Hub
    metric.compute(predictions=[["A man rides.", "He waves."]], references=[["A man cycles.", "He waves."]])
    # {"bleu": ..., "d_bleu": ..., "documents": 1, "sentences": 2, "signature": "nrefs:1|case:mixed|..."}

predictions / references: one list of sentences (str) per document, aligned sentence by sentence, one reference per
sentence (a list in place of a sentence, as sacreBLEU's multi-reference layout would give, is refused).
bleu: sacreBLEU corpus BLEU over every sentence of every document (each sentence scored once, with the context its
document gave it); d_bleu: BLEU over whole documents, each document's sentences joined by spaces as one segment
(n-grams may then cross sentence boundaries); signature: sacreBLEU's, for the sentence-level score.
tokenize (default: sacreBLEU's, 13a) and lowercase (default False): sacreBLEU's options, for both scores
(`metric.compute(..., tokenize="intl", lowercase=True)`).
"""

import datasets
import evaluate
import sacrebleu


def check_documents(name, documents):
    """Refuse anything but a list of documents, each a list of sentences (str)."""
    for i, document in enumerate(documents):
        if isinstance(document, str):
            raise TypeError(f"{name}: document {i} is a str; a document is a list of sentences")
        for j, sentence in enumerate(document):
            if not isinstance(sentence, str):
                raise TypeError(f"{name}: document {i}, sentence {j} is a {type(sentence).__name__}, not a str (a "
                                "document is a list of sentences; document_bleu takes one reference per sentence)")


def check_given(**documents):
    """check_documents for each keyword argument that is not None."""
    for name, value in documents.items():
        if value is not None:
            check_documents(name, value)


def bleu_metric(tokenize=None, lowercase=False):
    """sacreBLEU's BLEU with these options; an unknown tokenizer is a ValueError naming the known ones."""
    if tokenize is not None and tokenize not in sacrebleu.metrics.BLEU.TOKENIZERS:
        raise ValueError(f"tokenize={tokenize!r}: sacreBLEU's tokenizers are {list(sacrebleu.metrics.BLEU.TOKENIZERS)}")
    return sacrebleu.metrics.BLEU(tokenize=tokenize, lowercase=lowercase)


def document_scores(predictions, references, tokenize=None, lowercase=False):
    """The metric's computation as a plain function (same arguments and result as `DocumentBleu.compute`)."""
    check_documents("predictions", predictions)
    check_documents("references", references)
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predicted documents but {len(references)} reference documents")
    for i, (pred, ref) in enumerate(zip(predictions, references)):
        if len(pred) != len(ref):
            raise ValueError(f"document {i}: {len(pred)} translated sentences but {len(ref)} reference sentences")
    sentences = [s for doc in predictions for s in doc]
    reference_sentences = [s for doc in references for s in doc]
    if not sentences:
        raise ValueError(f"no sentences to score ({len(predictions)} documents, none with a sentence)")
    metric = bleu_metric(tokenize, lowercase)
    bleu = metric.corpus_score(sentences, [reference_sentences]).score
    d_bleu = metric.corpus_score([" ".join(d) for d in predictions], [[" ".join(d) for d in references]]).score
    return {"bleu": bleu, "d_bleu": d_bleu, "documents": len(predictions), "sentences": len(sentences),
            "signature": str(metric.get_signature())}


class DocumentBleu(evaluate.Metric):
    """Document-level BLEU (see the module docstring)."""

    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Post, 2018. A Call for Clarity in Reporting BLEU Scores (sacreBLEU).",
            inputs_description="predictions, references: lists (one per document) of sentences (str), one reference "
                               "per sentence; tokenize, lowercase: sacreBLEU's options",
            features=datasets.Features({
                "predictions": datasets.Sequence(datasets.Value("string")),
                "references": datasets.Sequence(datasets.Value("string")),
            }),
        )

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        """evaluate's add_batch, after checking that every sentence is a str (evaluate would store any other value
        as its string form)."""
        check_given(predictions=predictions, references=references)
        return super().add_batch(predictions=predictions, references=references, **kwargs)

    def add(self, *, prediction=None, reference=None, **kwargs):
        """evaluate's add (one document), after the same check as add_batch."""
        check_given(prediction=None if prediction is None else [prediction],
                    reference=None if reference is None else [reference])
        return super().add(prediction=prediction, reference=reference, **kwargs)

    def _compute(self, predictions, references, tokenize=None, lowercase=False, **unknown):
        if unknown:
            raise ValueError(f"document_bleu's options are tokenize and lowercase (sacreBLEU's), not {sorted(unknown)}")
        return document_scores(predictions, references, tokenize=tokenize, lowercase=lowercase)
