"""Inputs that the evaluation functions and the document_bleu metric refuse by name, or score at their limits."""

import math

import evaluate
import numpy as np
import pytest
import sacrebleu
import torch
from transformers import EvalPrediction

from talk_hf.metrics import DOCUMENT_BLEU
from talk_hf.metrics.document_bleu.document_bleu import document_scores
from talk_hf.tokenization import train_joint_bpe
from talk_hf.training.evaluation import corpus_bleu, corpus_chrf, document_metrics, perplexity

PREDICTIONS = [["A man rides a bike.", "He waves at us."]]
REFERENCES = [["A man cycles on a bike.", "He waves at us."]]


# --- document_bleu -------------------------------------------------------------------------------------------------


def test_several_references_per_sentence_are_refused_before_evaluate_stores_them():
    metric = evaluate.load(DOCUMENT_BLEU)
    nested = [[["A man cycles on a bike."], ["He waves at us."]]]
    with pytest.raises(TypeError, match="references: document 0, sentence 0 is a list, not a str"):
        metric.compute(predictions=PREDICTIONS, references=nested)
    with pytest.raises(TypeError, match="references: document 0, sentence 0 is a list"):
        metric.add_batch(predictions=PREDICTIONS, references=nested)
    with pytest.raises(TypeError, match="reference: document 0, sentence 1 is a list"):
        metric.add(prediction=PREDICTIONS[0], reference=["A man cycles on a bike.", ["He waves at us."]])
    with pytest.raises(TypeError, match="predictions: document 0, sentence 1 is a NoneType"):
        metric.compute(predictions=[["A man rides a bike.", None]], references=REFERENCES)
    with pytest.raises(TypeError, match="references: document 0, sentence 0 is a list"):
        document_scores(PREDICTIONS, nested)
    # nothing refused was stored: the next computation scores its own documents only
    expected = sacrebleu.metrics.BLEU().corpus_score(PREDICTIONS[0], [REFERENCES[0]]).score
    result = metric.compute(predictions=PREDICTIONS, references=REFERENCES)
    assert result["bleu"] == pytest.approx(expected) and result["documents"] == 1


def test_sacrebleus_tokenize_and_lowercase_options():
    metric = evaluate.load(DOCUMENT_BLEU)
    shouted = [[s.upper() for s in PREDICTIONS[0]]]
    assert metric.compute(predictions=shouted, references=REFERENCES)["bleu"] < 10
    result = metric.compute(predictions=shouted, references=REFERENCES, tokenize="intl", lowercase=True)
    expected = sacrebleu.metrics.BLEU(tokenize="intl", lowercase=True)
    assert result["bleu"] == pytest.approx(expected.corpus_score(shouted[0], [REFERENCES[0]]).score)
    assert "case:lc" in result["signature"] and "tok:intl" in result["signature"]
    d_bleu = sacrebleu.metrics.BLEU(tokenize="intl", lowercase=True).corpus_score(
        [" ".join(shouted[0])], [[" ".join(REFERENCES[0])]]).score
    assert result["d_bleu"] == pytest.approx(d_bleu)


def test_unknown_options_are_refused_by_name():
    metric = evaluate.load(DOCUMENT_BLEU)
    with pytest.raises(ValueError, match=r"options are tokenize and lowercase .*\['smooth_method'\]"):
        metric.compute(predictions=PREDICTIONS, references=REFERENCES, smooth_method="floor")
    with pytest.raises(ValueError, match="tokenize='moses': sacreBLEU's tokenizers are"):
        metric.compute(predictions=PREDICTIONS, references=REFERENCES, tokenize="moses")


# --- evaluation.py -------------------------------------------------------------------------------------------------


def test_document_metrics_refuses_logits_by_naming_predict_with_generate():
    tokenizer = train_joint_bpe(PREDICTIONS[0] + REFERENCES[0], vocab_size=40, min_frequency=1)
    compute = document_metrics(tokenizer, [0, 0])
    labels = np.array([[5, 6, 2], [7, 2, -100]])
    logits = np.zeros((2, 3, len(tokenizer)), dtype=np.float32)
    for predictions in ((logits, np.zeros((2, 4, 16), dtype=np.float32)), logits):  # as Seq2SeqTrainer gives them
        with pytest.raises(ValueError, match=r"predict_with_generate=True"):
            compute(EvalPrediction(predictions=predictions, label_ids=labels))
    scores = compute(EvalPrediction(predictions=labels, label_ids=labels))  # generated ids are scored
    assert set(scores) == {"bleu", "d_bleu"}


@pytest.mark.parametrize("score", [corpus_bleu, corpus_chrf])
def test_an_empty_corpus_is_refused_by_name(score):
    with pytest.raises(ValueError, match="no hypotheses to score"):
        score([], [])
    with pytest.raises(ValueError, match="1 hypotheses but 0 references"):
        score(["a"], [])


def test_perplexity_past_the_largest_float_is_inf():
    assert perplexity(800.0) == math.inf
    assert perplexity(1.0) == pytest.approx(math.e)


# --- scoring against what the labels hold ---------------------------------------------------------------------------

SCORED = {  # targets whose labels the tokenizer normalises: lowercased, NFKC (fullwidth comma), Chinese
    "lowercase": (["Wagner was a German composer, and a conductor.", "He waves at us."], True),
    "chinese": (["瓦格纳是德国作曲家，也是指挥家。", "他向我们挥手，然后走了。"], False),
}


@pytest.mark.parametrize("case", list(SCORED))
def test_a_model_that_writes_its_labels_scores_100(case, monkeypatch):
    """References are scored as the tokenizer writes text (NFKC, lowercased when it lowercases: case-insensitive,
    `case:lc`), with sacreBLEU's zh tokenizer for Chinese: sentence- and document-level evaluation give a model
    that reproduces its labels 100."""
    import datasets

    from talk_hf.training import run
    from talk_hf.training.corpora import document_windows

    targets, lowercase = SCORED[case]
    tokenizer = train_joint_bpe(["ein hund .", "er winkt ."] + targets, vocab_size=200, lowercase=lowercase,
                                min_frequency=1)
    labels = {text: tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) for text in targets}
    assert any(label != text for text, label in labels.items())  # the labels differ from the raw references
    sentences = datasets.Dataset.from_dict({"doc_id": ["a", "a"], "source": ["ein hund .", "er winkt ."],
                                            "target": targets})
    monkeypatch.setattr(run, "translate", lambda model, tok, sources, **kw: [labels[t] for t in targets])
    model = torch.nn.Module()  # translations come from the labels
    result = run.evaluate_translation(model, tokenizer, sentences)
    assert result["bleu"] == pytest.approx(100) and result["chrf"] == pytest.approx(100)
    assert ("case:lc" in result["signature"]) == lowercase and ("tok:zh" in result["signature"]) == (case == "chinese")
    windows = document_windows(sentences, window=1)
    monkeypatch.setattr(run, "translate_documents_counted", lambda *a, **kw: ([[labels[t] for t in targets]], 0))
    result = run.evaluate_translation(model, tokenizer, windows, document_level=True)
    assert result["bleu"] == result["d_bleu"] == pytest.approx(100) and result["chrf"] == pytest.approx(100)


def test_a_normaliser_that_writes_spaces_as_metaspace_leaves_the_references_as_they_are():
    """Gemma's and legacy Llama tokenizers' normalisers write " " as "▁" (the pre-tokenizer's input, not text a
    model writes): references stay as given, and exact hypotheses score 100."""
    from tokenizers import Tokenizer, models, normalizers
    from transformers import PreTrainedTokenizerFast

    from talk_hf.training.evaluation import scoring

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>")
    references = ["The cat sat on the mat .", "A dog ran ."]
    scored, options = scoring(tokenizer, references)
    assert scored == references and options == {"tokenize": None, "lowercase": False}
    assert corpus_bleu(references, scored, **options)[0] == pytest.approx(100)
