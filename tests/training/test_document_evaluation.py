"""Document-level evaluation: a split of document windows translated as whole documents and scored sentence by
sentence, with the document_bleu `evaluate` metric shipped in the package."""

import warnings

import datasets
import numpy as np
import evaluate
import pytest
import sacrebleu
import torch

from talk_hf import ContextShortenedWarning, translate_document_streaming, translate_documents
from talk_hf.metrics import DOCUMENT_BLEU
from talk_hf.tokenization import train_joint_bpe
from talk_hf.training.corpora import document_windows
from talk_hf.training.models import build_model
from talk_hf.training.run import evaluate_translation, split_documents
from tests.convert.fairseq_layout import fairseq_tokenizer

SOURCES = ["ein hund läuft .", "er bellt .", "die katze rennt weg .", "ein mann sieht den hund .", "er ruft ihn ."]
TARGETS = ["a dog runs .", "it barks .", "the cat runs away .", "a man sees the dog .", "he calls it ."]
GREEDY = dict(num_beams=1, length_penalty=1.0, max_new_tokens=5)
TINY = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=24, decoder_ffn_dim=24,
            encoder_attention_heads=2, decoder_attention_heads=2)
RFA = dict(TINY, causal_num_frequencies=8, cross_num_frequencies=8)


def tiny_model(kind, tokenizer, **overrides):
    torch.manual_seed(0)
    return build_model(kind, tokenizer, overrides=dict(RFA if kind == "rfa_doc" else TINY, **overrides)).eval()


@pytest.fixture(scope="module")
def setup():
    sentences = datasets.Dataset.from_dict({"doc_id": ["a"] * 3 + ["b"] * 2, "source": SOURCES, "target": TARGETS})
    tokenizer = train_joint_bpe(SOURCES + TARGETS, vocab_size=80, min_frequency=1)
    return tiny_model("rfa_doc", tokenizer, dropout=0.0), tokenizer, document_windows(sentences, window=2)


def test_a_split_of_windows_gives_back_its_documents(setup):
    _, _, windows = setup
    sources, references, window = split_documents(windows)
    assert sources == [SOURCES[:3], SOURCES[3:]] and references == [TARGETS[:3], TARGETS[3:]] and window == 2


def test_a_split_with_a_blank_sentence_gives_back_its_documents():
    """document_windows leaves a blank sentence out of the other windows; the split's check of each row's context
    reads them so."""
    rows = datasets.Dataset.from_dict({"doc_id": ["a"] * 4, "source": ["s1", "", "s3", "s4"],
                                       "target": ["t1", "", "t3", "t4"]})
    sources, references, window = split_documents(document_windows(rows, window=3))
    assert sources == [["s1", "", "s3", "s4"]] and references == [["t1", "", "t3", "t4"]] and window == 3


@pytest.mark.parametrize("decoding", ["sliding", "streaming", "windows"])
def test_every_document_decoding_translates_a_blank_sentence_as_empty(setup, decoding):
    _, tokenizer, _ = setup
    model = tiny_model("rfa_doc", tokenizer, dropout=0.0)
    model.generation_config.min_new_tokens = 3  # every translated sentence has words
    rows = datasets.Dataset.from_dict({"doc_id": ["a"] * 3, "source": [SOURCES[0], "", SOURCES[2]],
                                       "target": [TARGETS[0], "", TARGETS[2]]})
    result = evaluate_translation(model, tokenizer, document_windows(rows, window=2), document_level=True,
                                  document_decoding=decoding, **GREEDY)
    assert result["hypotheses"][1] == "" and all(result["hypotheses"][k] for k in (0, 2))


def test_sentence_level_scoring_refuses_a_split_of_document_windows(setup):
    """Sentence-level BLEU of windows would score hypotheses (separators dropped as special tokens) against
    references still holding them: a model translating every window exactly would not score 100. Refused by name;
    a split of one-sentence windows is a split of sentences, scored as one."""
    model, tokenizer, windows = setup
    with pytest.raises(ValueError, match="^this split holds document windows .* document_level=True"):
        evaluate_translation(model, tokenizer, windows, **GREEDY)
    sentences = datasets.Dataset.from_dict({"doc_id": ["a"] * 3, "source": SOURCES[:3], "target": TARGETS[:3]})
    assert evaluate_translation(model, tokenizer, document_windows(sentences, window=1), **GREEDY)["sentences"] == 3


def test_sentence_level_scoring_translates_a_blank_source_as_empty(setup):
    """As translate.py and every document decoding do: a blank line's translation is "", not what the model makes
    of an empty source."""
    _, tokenizer, _ = setup
    model = tiny_model("rfa_doc", tokenizer, dropout=0.0)
    model.generation_config.min_new_tokens = 3  # every translated sentence has words
    rows = {"source": [SOURCES[0], " ", SOURCES[2]], "target": [TARGETS[0], "", TARGETS[2]]}
    result = evaluate_translation(model, tokenizer, rows, **GREEDY)
    assert result["hypotheses"][1] == "" and all(result["hypotheses"][k] for k in (0, 2))


def test_a_split_that_lost_windows_is_refused(setup):
    _, _, windows = setup  # document "a" without its second window: the third would follow the first
    with pytest.raises(ValueError, match="document 'a': row 1 .* lost windows"):
        split_documents(windows.select([0, 2, 3, 4]))


def test_sliding_evaluation_translates_whole_documents(setup):
    model, tokenizer, windows = setup
    result = evaluate_translation(model, tokenizer, windows, document_level=True, **GREEDY)
    hyps = translate_documents(model, tokenizer, [SOURCES[:3], SOURCES[3:]], window=2, **GREEDY)
    assert result["hypotheses"] == hyps[0] + hyps[1]
    expected = evaluate.load(DOCUMENT_BLEU).compute(predictions=hyps, references=[TARGETS[:3], TARGETS[3:]])
    assert (result["bleu"], result["d_bleu"], result["sentences"], result["documents"]) == (
        expected["bleu"], expected["d_bleu"], 5, 2)
    assert result["chrf"] == sacrebleu.corpus_chrf(hyps[0] + hyps[1], [TARGETS]).score  # every sentence, in order
    assert result["chrf_signature"].startswith("nrefs:1")
    assert result["window"] == 2 and result["document_decoding"] == "sliding" and result["context_shortened"] == 0


@pytest.mark.parametrize("decoding", ["sliding", "streaming"])
def test_document_evaluation_decodes_in_eval_mode(setup, decoding):
    """The training loop hands its model over in training mode (dropout on, RFA's random features redrawn every
    forward); its test scores must be those of the model as saved and loaded."""
    _, tokenizer, windows = setup
    model = tiny_model("rfa_doc", tokenizer, dropout=0.5)
    expected = evaluate_translation(model, tokenizer, windows, document_level=True, document_decoding=decoding,
                                    **GREEDY)
    for seed in range(3):  # every draw of dropout and features gives the eval-mode translations
        torch.manual_seed(seed)
        got = evaluate_translation(model.train(), tokenizer, windows, document_level=True,
                                   document_decoding=decoding, **GREEDY)
        assert got["hypotheses"] == expected["hypotheses"]


def test_sliding_evaluation_counts_the_windows_shortened_to_fit_positions(setup):
    _, tokenizer, windows = setup
    marian = tiny_model("marian", tokenizer, dropout=0.0, max_position_embeddings=12)
    with pytest.warns(ContextShortenedWarning) as caught:
        result = evaluate_translation(marian, tokenizer, windows, document_level=True, **GREEDY)
    assert result["context_shortened"] == caught[0].message.shortened > 0
    with pytest.warns(ContextShortenedWarning):
        hyps = translate_documents(marian, tokenizer, [SOURCES[:3], SOURCES[3:]], window=2, **GREEDY)
    assert result["hypotheses"] == hyps[0] + hyps[1]


def test_streaming_and_independent_window_evaluation(setup):
    model, tokenizer, windows = setup
    greedy = {k: v for k, v in GREEDY.items() if k not in ("num_beams", "length_penalty")}
    streamed = evaluate_translation(model, tokenizer, windows, document_level=True,
                                    document_decoding="streaming", **GREEDY)
    assert streamed["hypotheses"] == [s for doc in (SOURCES[:3], SOURCES[3:])
                                      for s in translate_document_streaming(model, tokenizer, doc, window=2, **greedy)]
    alone = evaluate_translation(model, tokenizer, windows, document_level=True, document_decoding="windows",
                                 **GREEDY)
    assert len(alone["hypotheses"]) == 5
    with pytest.raises(ValueError, match="num_beams=1"):
        evaluate_translation(model, tokenizer, windows, document_level=True, document_decoding="streaming",
                             num_beams=2)
    with pytest.raises(ValueError, match="doc_id"):
        evaluate_translation(model, tokenizer, windows.remove_columns("doc_id"), document_level=True)


def test_document_bleu_metric():
    metric = evaluate.load(DOCUMENT_BLEU)
    refs = [["a man rides a red bike in the park .", "he waves at us ."], ["two dogs play in the snow ."]]
    perfect = metric.compute(predictions=refs, references=refs)
    assert perfect["bleu"] == pytest.approx(100) and perfect["d_bleu"] == pytest.approx(100)
    assert (perfect["documents"], perfect["sentences"]) == (2, 3) and perfect["signature"].startswith("nrefs:1")
    # a sentence's translation given as part of the next one: the same words, scored lower on both levels
    shifted = metric.compute(predictions=[[refs[0][0], ""], [refs[0][1] + " " + refs[1][0]]], references=refs)
    assert shifted["bleu"] < 90 and shifted["d_bleu"] < 90
    with pytest.raises(ValueError, match="document 1: 2 translated sentences but 1 reference"):
        metric.compute(predictions=[refs[0], refs[0]], references=refs)
    from talk_hf.metrics.document_bleu.document_bleu import document_scores

    for empty in ([], [[]]):
        with pytest.raises(ValueError, match="no sentences to score"):
            document_scores(empty, empty)


def test_seq2seq_trainer_document_metrics(setup):
    """compute_metrics for Seq2SeqTrainer: generated windows -> their last sentences, grouped into documents by
    doc_id, scored by document_bleu."""
    from transformers import EvalPrediction

    from talk_hf.training.evaluation import document_metrics

    _, tokenizer, windows = setup
    labels = tokenizer(text_target=list(windows["target"]), padding=True, return_tensors="np")["input_ids"]
    labels[labels == tokenizer.pad_token_id] = -100
    compute = document_metrics(tokenizer, windows["doc_id"])
    assert compute(EvalPrediction(predictions=labels, label_ids=labels)) == {"bleu": pytest.approx(100),
                                                                             "d_bleu": pytest.approx(100)}
    swapped = labels[[1, 0, 2, 3, 4]]  # the first document's first two sentences exchanged
    expected = evaluate.load(DOCUMENT_BLEU).compute(predictions=[[TARGETS[1], TARGETS[0], TARGETS[2]], TARGETS[3:]],
                                                    references=[TARGETS[:3], TARGETS[3:]])
    got = compute(EvalPrediction(predictions=swapped, label_ids=labels))
    assert got == {"bleu": pytest.approx(expected["bleu"]), "d_bleu": pytest.approx(expected["d_bleu"])}
    with pytest.raises(ValueError, match="4 predictions for an evaluation set of 5 rows"):
        compute(EvalPrediction(predictions=labels[:4], label_ids=labels[:4]))


def test_document_metrics_split_windows_at_the_tokenizers_separator_and_keep_what_it_decodes(tmp_path):
    from transformers import EvalPrediction

    from talk_hf.training.evaluation import document_metrics, window_last_sentences

    words = ["[@@SEP@@]", "a", "dog", "runs", ".", "x"]  # a converted rfa-doc-mt tokenizer in miniature
    tok = fairseq_tokenizer(tmp_path, "".join(f"{w} 1\n" for w in words), sep_token="[@@SEP@@]")
    predicted = tok(["x [@@SEP@@] a dog runs ."])["input_ids"]  # the same last sentence, another context
    labels = tok(["a [@@SEP@@] a dog runs ."])["input_ids"]
    scores = document_metrics(tok, ["d"])(EvalPrediction(predictions=np.array(predicted), label_ids=np.array(labels)))
    assert scores == {"bleu": pytest.approx(100), "d_bleu": pytest.approx(100)}
    # fairseq's decoding keeps <unk>, and so does the sentence scored ("a  runs ." if it were dropped)
    assert window_last_sentences(tok, tok(["a [@@SEP@@] a zebra runs ."])["input_ids"]) == ["a <unk> runs ."]


def test_document_metrics_warn_of_windows_cut_by_the_generation_limit(setup):
    """A generated window without </s> was cut by the generation length limit: its last sentence may be a context
    sentence cut short rather than the window's current one, which the scores cannot tell; they warn, naming the
    limits to raise."""
    from transformers import EvalPrediction

    from talk_hf.training.evaluation import document_metrics

    _, tokenizer, windows = setup
    labels = tokenizer(text_target=list(windows["target"]), padding=True, return_tensors="np")["input_ids"]
    start = np.full((len(labels), 1), tokenizer.eos_token_id)  # generated rows begin with the decoder start (</s>)
    generated = np.concatenate([start, labels], axis=1)
    compute = document_metrics(tokenizer, windows["doc_id"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        complete = compute(EvalPrediction(predictions=generated, label_ids=labels))
    cut = generated.copy()
    cut[1, 3:] = tokenizer.pad_token_id  # row 1 stops after two tokens of its context sentence, without </s>
    with pytest.warns(UserWarning, match=r"1 of 5 generated windows have no </s>.*generation_max_length.*"
                                         r"max_new_tokens"):
        compute(EvalPrediction(predictions=cut, label_ids=labels))
    assert complete == {"bleu": pytest.approx(100), "d_bleu": pytest.approx(100)}
