"""Document translation: sliding windows with the forced target context (any encoder-decoder, a transformers
baseline included) and streaming with the decoder state carried across sentences (talk_hf models)."""

import copy
import warnings

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteriaList

from talk_hf import ContextShortenedWarning, translate_document, translate_document_streaming, translate_documents
from talk_hf.document_translation import translate_documents_counted
from talk_hf.tokenization import SEP_ID, SEP_TOKEN, document_separator, join_sentences, train_joint_bpe
from talk_hf.training.models import build_model
from tests.models.tiny import cache_of
from tests.utils import StopsAtToken

SENTENCES = ["a dog runs in the park .", "it barks at a cat .", "the cat runs away .", "a man sees the dog .",
             "he calls it home .", "the dog comes back ."]
DOCUMENTS = [SENTENCES[:5], SENTENCES[3:5], SENTENCES[1:]]
TINY = dict(d_model=16, encoder_layers=1, decoder_layers=2, encoder_ffn_dim=24, decoder_ffn_dim=24,
            decoder_attention_heads=2, dropout=0.0)
FAMILY = {"talk": dict(encoder_heads=2, decoder_heads=2, encoder_max_offsets=[2], decoder_max_offsets=[3, 5]),
          "dynamic_conv": dict(encoder_conv_heads=2, decoder_conv_heads=2, encoder_kernel_sizes=[3],
                               decoder_kernel_sizes=[3, 5]),
          # rfa_init_scale 0.25 as in tests/models/tiny.py: with the reference's init at d_model 16 the tiny RFA-doc
          # model ends most sentences at their first token, and these tests need translations that have words
          "rfa_doc": dict(encoder_attention_heads=2, causal_num_frequencies=8, cross_num_frequencies=8,
                          gate_bias_init=0.0, rfa_init_scale=0.25),
          "marian": dict(encoder_attention_heads=2)}
GREEDY = dict(max_new_tokens=6, num_beams=1, do_sample=False)


@pytest.fixture(scope="module")
def tokenizer():
    return train_joint_bpe(SENTENCES * 3, vocab_size=80, min_frequency=1)


def model_for(kind, tokenizer, seed=0, **overrides):
    torch.manual_seed(seed)
    return build_model(kind, tokenizer, overrides=dict(TINY, **FAMILY[kind], **overrides)).eval()


def by_hand(model, tokenizer, sentences, window, positions=None, shortened=None, **generate_kwargs):
    """The sliding-window definition, one window at a time: source window joined by <sep>; decoder forced with
    the decoder start (the start token, given or the model's, and a forced_bos_token_id given or configured) and
    the ids kept for the previous window sentences, each followed by <sep>; generate until </s> or <sep>; keep what
    comes before the first </s> or <sep>. With `positions`, a window drops its oldest sentences until its
    source and its decoder start, prefix and max_new_tokens each fit (counted in the list `shortened`)."""
    start = decoder_start(model, generate_kwargs)
    stops = {SEP_ID, tokenizer.eos_token_id}
    kept = []
    for i in range(len(sentences)):
        for first in range(max(0, i - window + 1), i + 1):
            source = tokenizer(join_sentences(sentences[first : i + 1]), return_tensors="pt")
            prefix = [t for ids in kept[first:] for t in ids + [SEP_ID]]
            if positions is None or (source["input_ids"].shape[1] <= positions
                                     and len(start) + len(prefix) + generate_kwargs["max_new_tokens"] <= positions):
                break
        if first > max(0, i - window + 1):
            shortened.append(i)
        out = model.generate(**source, decoder_input_ids=torch.tensor([start + prefix]),
                             eos_token_id=[tokenizer.eos_token_id, SEP_ID], **generate_kwargs)
        assert out[0, : len(start) + len(prefix)].tolist() == start + prefix  # the prefix is forced
        new = out[0, len(start) + len(prefix) :].tolist()
        kept.append(new[: next((j for j, t in enumerate(new) if t in stops), len(new))])
    return [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in kept]


def decoder_start(model, generate_kwargs):
    """The ids every decoder input begins with: the start token (given, else the model's), then the forced BOS
    token (given, else the model's generation config's), if any."""
    start = generate_kwargs.get("decoder_start_token_id", model.config.decoder_start_token_id)
    bos = generate_kwargs.get("forced_bos_token_id", model.generation_config.forced_bos_token_id)
    return [start] + ([bos] if bos is not None else [])


@pytest.mark.parametrize("kind", ["talk", "dynamic_conv", "rfa_doc", "marian"])
def test_sliding_windows_equal_the_windows_translated_by_hand(kind, tokenizer):
    model = model_for(kind, tokenizer)
    got = translate_documents(model, tokenizer, DOCUMENTS, window=3, **GREEDY)
    assert got == [by_hand(model, tokenizer, doc, 3, **GREEDY) for doc in DOCUMENTS]
    assert [len(t) for t in got] == [len(d) for d in DOCUMENTS]
    assert any(t for doc in got for t in doc)  # the tiny models do generate words


def test_a_window_past_the_models_positions_drops_its_oldest_context(tokenizer):
    """Marian's decoder has max_position_embeddings positions: a forced prefix of earlier translations plus
    max_new_tokens may pass them, and the window then loses context sentences instead of indexing past its
    position table."""
    model = model_for("marian", tokenizer, seed=4, max_position_embeddings=18)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = translate_documents(model, tokenizer, DOCUMENTS, window=3, **GREEDY)
    shortened = []
    assert got == [by_hand(model, tokenizer, doc, 3, positions=18, shortened=shortened, **GREEDY)
                   for doc in DOCUMENTS]
    assert 0 < len(shortened) < sum(map(len, DOCUMENTS))  # some windows lost context, not all
    [record] = [w for w in caught if issubclass(w.category, ContextShortenedWarning)]
    warning = record.message
    assert record.filename == __file__  # attributed to the caller
    assert (warning.shortened, warning.windows) == (len(shortened), sum(map(len, DOCUMENTS)))
    assert f"{len(shortened)} of {sum(map(len, DOCUMENTS))} windows" in str(warning)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # enough positions: nothing shortened, no warning
        assert translate_documents(model_for("marian", tokenizer, seed=4), tokenizer, DOCUMENTS, window=3,
                                   **GREEDY) == [by_hand(model_for("marian", tokenizer, seed=4), tokenizer, doc, 3,
                                                         **GREEDY) for doc in DOCUMENTS]


def test_what_cannot_fit_the_models_positions_is_refused(tokenizer):
    model = model_for("marian", tokenizer, max_position_embeddings=18)
    with pytest.raises(ValueError, match="may take 19 decoder positions .* but the model has 18"):
        translate_documents(model, tokenizer, DOCUMENTS, window=2, max_new_tokens=18)
    with pytest.raises(ValueError, match="sentence 1 of document 0 alone has .* 18 encoder positions"):
        translate_documents(model, tokenizer, [[SENTENCES[0], " ".join(SENTENCES)]], window=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="sentence 2 of document 1 alone has"):  # counted with the blank sentence
        translate_documents(model, tokenizer, [SENTENCES[:1], [SENTENCES[0], "", " ".join(SENTENCES)]], window=2,
                            max_new_tokens=4)


@pytest.mark.parametrize("kind", ["rfa_doc", "marian"])
def test_a_batch_of_documents_equals_one_at_a_time_with_beam_search(kind, tokenizer):
    model = model_for(kind, tokenizer, seed=1)
    kwargs = dict(window=2, num_beams=3, max_new_tokens=5, batch_size=2)
    batched = translate_documents(model, tokenizer, DOCUMENTS, **kwargs)
    assert batched == [translate_document(model, tokenizer, doc, **kwargs) for doc in DOCUMENTS]


def test_window_one_is_sentence_level_translation(tokenizer):
    model = model_for("talk", tokenizer)
    got = translate_document(model, tokenizer, "\n".join(SENTENCES[:3]) + "\n\n", window=1, **GREEDY)
    expected = [tokenizer.decode(model.generate(**tokenizer([s], return_tensors="pt"), **GREEDY)[0],
                                 skip_special_tokens=True).strip() for s in SENTENCES[:3]]
    assert got == expected


def streaming_by_hand(model, tokenizer, sentences, window, max_new_tokens, **start):
    """Streaming's definition with forward calls: one decoder state for the document; sentence i's source window
    replaces the cross-attention source; greedy tokens until </s> or <sep>; the next sentence starts with <sep>.
    start: decoder_start_token_id / forced_bos_token_id, as `decoder_start` takes them."""
    stops = {SEP_ID, tokenizer.eos_token_id}
    cache, feed, out = None, decoder_start(model, start), []
    with torch.no_grad():
        for i in range(len(sentences)):
            source = tokenizer(join_sentences(sentences[max(0, i - window + 1) : i + 1]), return_tensors="pt")
            if cache is not None:
                cache.cross_attention_cache.reset()
            kept, ended = [], False
            for _ in range(max_new_tokens):
                step = model(**source, decoder_input_ids=torch.tensor([feed]), cache=cache, use_cache=True)
                cache, token = cache_of(step), int(step.logits[0, -1].argmax())
                if token in stops:
                    ended = True
                    break
                kept.append(token)
                feed = [token]
            out.append(kept)
            # a stop token is not fed; the last kept token of a sentence cut by max_new_tokens is not fed yet
            feed = [SEP_ID] if ended else feed + [SEP_ID]
    return [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in out]


@pytest.mark.parametrize("kind", ["rfa_doc", "talk"])
def test_streaming_equals_its_step_by_step_definition(kind, tokenizer):
    model = model_for(kind, tokenizer, seed=2)
    got = translate_document_streaming(model, tokenizer, SENTENCES, window=2, max_new_tokens=4)
    assert got == streaming_by_hand(model, tokenizer, SENTENCES, 2, 4)
    assert len(got) == len(SENTENCES)


def test_streaming_carries_the_state_sliding_windows_do_not(tokenizer):
    """With window 1 the two decodings differ only by the carried decoder state: a model whose translations
    depend on it gives other tokens (otherwise the test could not tell the two apart)."""
    model = model_for("rfa_doc", tokenizer, seed=3)
    sliding = translate_document(model, tokenizer, SENTENCES, window=1, **GREEDY)
    streaming = translate_document_streaming(model, tokenizer, SENTENCES, window=1, max_new_tokens=6)
    assert sliding[0] == streaming[0] and sliding != streaming


def test_a_model_in_training_mode_is_warned_about(tokenizer):
    """generate() does not switch modes, and a model straight from Trainer.train() is in training mode: both
    decodings warn, naming the fix, and stay silent in eval mode."""
    model = model_for("rfa_doc", tokenizer).train()
    with pytest.warns(UserWarning, match=r"training mode.*call model\.eval\(\)") as caught:
        translate_document(model, tokenizer, SENTENCES[:2], window=2, **GREEDY)
    [record] = [w for w in caught if "training mode" in str(w.message)]
    assert record.filename == __file__  # attributed to the caller
    with pytest.warns(UserWarning, match="RfaDocForConditionalGeneration is in training mode"):
        translate_document_streaming(model, tokenizer, SENTENCES[:2], window=2, max_new_tokens=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        translate_document(model.eval(), tokenizer, SENTENCES[:2], window=2, **GREEDY)
        translate_document_streaming(model, tokenizer, SENTENCES[:2], window=2, max_new_tokens=3)


def test_bad_arguments_are_refused_by_name(tokenizer):
    model = model_for("talk", tokenizer)
    with pytest.raises(ValueError, match="window"):
        translate_document(model, tokenizer, SENTENCES, window=0)
    with pytest.raises(ValueError, match="num_return_sequences"):
        translate_document(model, tokenizer, SENTENCES, num_beams=2, num_return_sequences=2)
    with pytest.raises(ValueError, match="decoder_input_ids"):
        translate_document(model, tokenizer, SENTENCES, decoder_input_ids=torch.tensor([[2]]))
    with pytest.raises(TypeError, match="list of sentences"):
        translate_document(model, tokenizer, [SENTENCES])
    with pytest.raises(ValueError, match="num_beams must be 1"):
        translate_document_streaming(model, tokenizer, SENTENCES, num_beams=2)
    with pytest.raises(ValueError, match="talk_hf encoder-decoder"):
        translate_document_streaming(model_for("marian", tokenizer), tokenizer, SENTENCES)
    with pytest.raises(ValueError, match="no '<para>' token"):
        translate_document(model, tokenizer, SENTENCES, window=2, sep_token="<para>")


def test_streaming_is_greedy_whatever_the_models_generation_config_says(tokenizer):
    """A model saved by the training loop or converted from fairseq carries num_beams 4 in its generation config:
    streaming carries one state and must not run a beam search over it."""
    model = model_for("rfa_doc", tokenizer, seed=2)
    greedy = translate_document_streaming(model, tokenizer, SENTENCES, window=2, max_new_tokens=4)
    model.generation_config.num_beams = 4
    assert translate_document_streaming(model, tokenizer, SENTENCES, window=2, max_new_tokens=4) == greedy
    assert greedy == streaming_by_hand(model, tokenizer, SENTENCES, 2, 4)


def test_one_translation_per_sentence_whatever_the_generation_config_asks(tokenizer):
    """num_return_sequences > 1 in the model's generation config (or one passed in) would give a batch several rows
    per window: each document still gets its own sentences' translations."""
    from transformers import GenerationConfig

    model = model_for("talk", tokenizer, seed=1)
    kwargs = dict(window=2, num_beams=2, max_new_tokens=5, batch_size=3)
    alone = [translate_document(model, tokenizer, doc, **kwargs) for doc in DOCUMENTS]
    asked = GenerationConfig(num_beams=2, num_return_sequences=2, max_new_tokens=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a config passed in takes the per-sentence settings: no mixed arguments
        assert translate_documents(model, tokenizer, DOCUMENTS, window=2, batch_size=3, generation_config=asked) \
            == alone
    assert asked.num_return_sequences == 2  # the caller's config is left as it was
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # generation arguments beside a config go into its copy
        assert translate_documents(model, tokenizer, DOCUMENTS, window=2, batch_size=3, num_beams=2,
                                   generation_config=GenerationConfig(max_new_tokens=5)) == alone
    with pytest.raises(ValueError, match="num_beams must be 1"):  # asked for in a config as in an argument
        translate_document_streaming(model, tokenizer, SENTENCES, generation_config=GenerationConfig(num_beams=2))
    model.generation_config.num_beams, model.generation_config.num_return_sequences = 2, 2
    assert translate_documents(model, tokenizer, DOCUMENTS, **kwargs) == alone


@pytest.mark.parametrize("kind", ["marian", "talk"])
def test_the_length_limit_is_each_new_sentences(kind, tokenizer):
    """Without max_new_tokens a sentence gets the generation config's limit for itself: its max_new_tokens, else its
    max_length less the start token (however long the forced prefix before it), else generate()'s 20."""
    model = model_for(kind, tokenizer, seed=4)
    assert model.generation_config.max_length is None and model.generation_config.max_new_tokens is None
    twenty = translate_documents(model, tokenizer, DOCUMENTS, window=3, num_beams=1)
    assert twenty == translate_documents(model, tokenizer, DOCUMENTS, window=3, num_beams=1, max_new_tokens=20)
    model.generation_config.max_length = 7
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no clash of max_length and max_new_tokens
        limited = translate_documents(model, tokenizer, DOCUMENTS, window=3, num_beams=1)
    assert limited == translate_documents(model, tokenizer, DOCUMENTS, window=3, num_beams=1, max_new_tokens=6)
    if kind == "talk":  # the streamed document's history passes 7 tokens: the limit is still each sentence's
        assert (translate_document_streaming(model, tokenizer, SENTENCES, window=2)
                == translate_document_streaming(model, tokenizer, SENTENCES, window=2, max_new_tokens=6))


def test_bad_documents_are_refused_by_name(tokenizer):
    model = model_for("talk", tokenizer)
    with pytest.raises(TypeError, match="got one str: translate_document translates a single document"):
        translate_documents(model, tokenizer, "\n".join(SENTENCES), window=2, **GREEDY)
    with pytest.raises(ValueError, match="sentence 1 of document 0 holds the separator '<sep>'"):
        translate_document(model, tokenizer, [SENTENCES[0], "a dog <sep> runs ."], window=2, **GREEDY)
    with pytest.raises(ValueError, match="sentence 0 of document 0 holds the separator"):
        translate_document_streaming(model, tokenizer, ["<sep>"], window=2, max_new_tokens=3)
    for name, instead in (("max_length", "max_new_tokens"), ("min_length", "min_new_tokens")):
        with pytest.raises(ValueError, match=f"{name} would count the forced prefix .* pass {instead}"):
            translate_document(model, tokenizer, SENTENCES, window=2, **{name: 9})
    with pytest.raises(ValueError, match="return_dict_in_generate"):
        translate_document(model, tokenizer, SENTENCES, window=2, return_dict_in_generate=True)
    with pytest.raises(ValueError, match="eos_token_id: document translation ends each sentence"):
        translate_document_streaming(model, tokenizer, SENTENCES, window=2, eos_token_id=2)
    # one sentence per line: only "\n" breaks a line (str.splitlines would also break at U+2028, form feeds, ...)
    assert translate_document(model, tokenizer, "a dog\u2028runs .\nit barks .", window=2, **GREEDY) == \
        translate_document(model, tokenizer, ["a dog\u2028runs .", "it barks ."], window=2, **GREEDY)
    lines = ["a dog runs .", "it barks .", "the cat runs away ."]  # as files break lines: \n, \r\n or \r
    assert translate_document(model, tokenizer, "a dog runs .\r\nit barks .\rthe cat runs away .", window=2,
                              **GREEDY) == translate_document(model, tokenizer, lines, window=2, **GREEDY)


def test_document_translation_pipeline(tokenizer):
    from transformers import pipeline

    model = model_for("rfa_doc", tokenizer)
    translator = pipeline("document-translation", model=model, tokenizer=tokenizer)
    one = translator(SENTENCES[:4], window=2, **GREEDY)
    assert one == {"translations": translate_document(model, tokenizer, SENTENCES[:4], window=2, **GREEDY)}
    assert translator("\n".join(SENTENCES[:4]), window=2, **GREEDY) == one
    several = translator(DOCUMENTS, window=3, **GREEDY)
    assert several == [{"translations": t} for t in translate_documents(model, tokenizer, DOCUMENTS, window=3,
                                                                          **GREEDY)]
    streamed = translator(SENTENCES, window=2, streaming=True, max_new_tokens=4)
    assert streamed == {"translations": translate_document_streaming(model, tokenizer, SENTENCES, window=2,
                                                                     max_new_tokens=4)}
    # a list of documents written one sentence per line, and windows of several documents per generate() call
    lines = ["\n".join(doc) for doc in DOCUMENTS]
    assert translator(lines, window=3, **GREEDY) == several
    assert translator(DOCUMENTS, window=3, batch_size=2, **GREEDY) == several
    with pytest.raises(ValueError, match="batch_size applies to sliding windows"):
        translator(DOCUMENTS, window=3, batch_size=2, streaming=True, max_new_tokens=4)
    # settings given when the pipeline is built hold for every call, merged key by key with a call's own
    built = pipeline("document-translation", model=model, tokenizer=tokenizer, window=3, max_new_tokens=6,
                     num_beams=1, do_sample=False)
    assert built(DOCUMENTS) == several and built(DOCUMENTS, batch_size=2) == several
    assert built(DOCUMENTS, max_new_tokens=3) == [{"translations": t} for t in translate_documents(
        model, tokenizer, DOCUMENTS, window=3, max_new_tokens=3, num_beams=1)]
    batched = pipeline("document-translation", model=model, tokenizer=tokenizer, batch_size=2, **GREEDY)
    assert batched(DOCUMENTS, window=3) == several



class EndsSentencesAfter(LogitsProcessor):
    """Forces </s> once the new sentence (the tokens after the decoder input's last <sep>) has `n` tokens."""

    def __init__(self, n, eos):
        self.n, self.eos = n, eos

    def __call__(self, input_ids, scores):
        for row, ids in enumerate(input_ids.tolist()):
            start = max((i for i, t in enumerate(ids) if t == SEP_ID), default=0)
            if len(ids) - 1 - start >= self.n:
                scores[row] = torch.where(torch.arange(scores.shape[1]) == self.eos, 0.0, -float("inf"))
        return scores


def test_a_configured_limit_as_long_as_the_positions_keeps_the_context(tokenizer):
    """Hub Marian models set max_length to their positions (512): a limit taken from the generation config is cut
    to the positions each window leaves, so no window drops its context for it (a given max_new_tokens still makes
    room)."""
    model = model_for("marian", tokenizer, seed=4, max_position_embeddings=40)
    model.generation_config.max_length = 40
    stop = dict(num_beams=1, logits_processor=LogitsProcessorList([EndsSentencesAfter(3, tokenizer.eos_token_id)]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ContextShortenedWarning
        got = translate_documents(model, tokenizer, DOCUMENTS, window=3, **stop)
    assert got == translate_documents(model, tokenizer, DOCUMENTS, window=3, max_new_tokens=8, **stop)
    assert sum(bool(t) for doc in got for t in doc) > len(DOCUMENTS)  # the sentences have words


def test_the_separator_is_the_tokenizers_own(tokenizer):
    """A tokenizer whose sep_token is not "<sep>" (a converted rfa-doc-mt one has "[@@SEP@@]") joins and splits
    windows with it; one whose sep_token ends sequences (BART's "</s>") falls back to "<sep>"."""
    own = copy.deepcopy(tokenizer)
    own.add_special_tokens({"sep_token": "[@@SEP@@]"})
    assert document_separator(own) == "[@@SEP@@]" and document_separator(own, "<sep>") == "<sep>"
    model = model_for("talk", own)
    assert translate_document(model, own, SENTENCES, window=2, **GREEDY) == translate_document(
        model, own, SENTENCES, window=2, sep_token="[@@SEP@@]", **GREEDY)
    with pytest.raises(ValueError, match=r"holds the separator '\[@@SEP@@\]'"):
        translate_document(model, own, ["a dog [@@SEP@@] runs .", "it barks ."], window=2, **GREEDY)
    bart_like = copy.deepcopy(tokenizer)
    bart_like.add_special_tokens({"sep_token": bart_like.eos_token})
    assert document_separator(bart_like) == SEP_TOKEN


class Prefers(LogitsProcessor):
    """Adds `bias` to one token's score at every step (a trained model's preference, in a tiny random one)."""

    def __init__(self, token, bias):
        self.token, self.bias = token, bias

    def __call__(self, input_ids, scores):
        scores[:, self.token] += self.bias
        return scores


def test_the_separator_ends_a_sentence_for_generate(tokenizer):
    """generate() is told that <sep> ends the sentence, as </s> does: min_new_tokens holds both back, and beam
    search ranks hypotheses that end at <sep> (not by what would follow it)."""
    model = model_for("talk", tokenizer)
    eager = dict(num_beams=1, max_new_tokens=6, min_new_tokens=3,
                 logits_processor=LogitsProcessorList([Prefers(SEP_ID, 50.0)]))
    got = translate_document(model, tokenizer, SENTENCES[:3], window=2, **eager)
    assert got == by_hand(model, tokenizer, SENTENCES[:3], 2, **eager)
    assert all(got)  # each sentence has its 3 tokens before the separator
    beams = dict(num_beams=4, max_new_tokens=8, logits_processor=LogitsProcessorList([Prefers(SEP_ID, 2.0)]))
    got = translate_document(model, tokenizer, SENTENCES[:3], window=2, **beams)
    assert got == by_hand(model, tokenizer, SENTENCES[:3], 2, **beams) and got[0]


def test_a_decoder_start_token_given_begins_every_window(tokenizer):
    """decoder_start_token_id, as an argument or in a generation config passed, is the start token of every
    window's decoder input (and of the streamed one)."""
    from transformers import GenerationConfig

    model = model_for("talk", tokenizer)
    other = tokenizer.bos_token_id
    expected = by_hand(model, tokenizer, SENTENCES[:4], 2, decoder_start_token_id=other, **GREEDY)
    assert expected != by_hand(model, tokenizer, SENTENCES[:4], 2, **GREEDY)  # the start token matters
    assert translate_document(model, tokenizer, SENTENCES[:4], window=2, decoder_start_token_id=other,
                              **GREEDY) == expected
    given = GenerationConfig(decoder_start_token_id=other, **GREEDY)
    assert translate_document(model, tokenizer, SENTENCES[:4], window=2, generation_config=given) == expected
    assert translate_document_streaming(model, tokenizer, SENTENCES[:4], window=2, max_new_tokens=4,
                                        decoder_start_token_id=other) == streaming_by_hand(
        model, tokenizer, SENTENCES[:4], 2, 4, decoder_start_token_id=other)
    with pytest.raises(ValueError, match="decoder_start_token_id must be one token id"):
        translate_document(model, tokenizer, SENTENCES[:4], window=2, decoder_start_token_id=[other], **GREEDY)


def test_a_forced_bos_token_begins_every_window_and_is_not_kept(tokenizer):
    """forced_bos_token_id (mBART-50's and NLLB's target language code), given or in the model's generation config,
    follows the start token in every window's decoder input: not generated, not counted in max_new_tokens, not in
    a sentence's translation or in a later window's prefix."""
    model = model_for("talk", tokenizer)
    language = 7
    expected = by_hand(model, tokenizer, SENTENCES[:4], 2, forced_bos_token_id=language, **GREEDY)
    assert translate_document(model, tokenizer, SENTENCES[:4], window=2, forced_bos_token_id=language,
                              **GREEDY) == expected
    streamed = streaming_by_hand(model, tokenizer, SENTENCES[:4], 2, 4, forced_bos_token_id=language)
    assert translate_document_streaming(model, tokenizer, SENTENCES[:4], window=2, max_new_tokens=4,
                                        forced_bos_token_id=language) == streamed
    model.generation_config.forced_bos_token_id = language
    assert translate_document(model, tokenizer, SENTENCES[:4], window=2, **GREEDY) == expected
    assert translate_document_streaming(model, tokenizer, SENTENCES[:4], window=2, max_new_tokens=4) == streamed
    marian = model_for("marian", tokenizer, seed=4, max_position_embeddings=18)  # the BOS takes a position too
    shortened = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextShortenedWarning)
        got = translate_documents(marian, tokenizer, DOCUMENTS, window=3, forced_bos_token_id=language, **GREEDY)
    assert got == [by_hand(marian, tokenizer, doc, 3, positions=18, shortened=shortened, forced_bos_token_id=language,
                           **GREEDY) for doc in DOCUMENTS]
    assert shortened


def test_a_configured_min_length_is_each_new_sentences(tokenizer):
    """A min_length in the model's generation config or one passed is each new sentence's, less the start token
    (as max_length is): min_new_tokens, the forced prefix not counted."""
    from transformers import GenerationConfig

    model = model_for("talk", tokenizer)
    eager = dict(num_beams=1, max_new_tokens=8, logits_processor=LogitsProcessorList([Prefers(tokenizer.eos_token_id,
                                                                                              50.0)]))
    four = translate_documents(model, tokenizer, DOCUMENTS, window=3, min_new_tokens=4, **eager)
    assert four == [by_hand(model, tokenizer, doc, 3, min_new_tokens=4, **eager) for doc in DOCUMENTS]
    free = translate_documents(model, tokenizer, DOCUMENTS, window=3, **eager)
    assert four != free
    streamed = translate_document_streaming(model, tokenizer, SENTENCES, window=2, min_new_tokens=4, **eager)
    passed = GenerationConfig(min_length=5, max_new_tokens=8, num_beams=1)
    assert translate_documents(model, tokenizer, DOCUMENTS, window=3, generation_config=passed,
                               logits_processor=eager["logits_processor"]) == four
    model.generation_config.min_length = 5
    assert translate_documents(model, tokenizer, DOCUMENTS, window=3, **eager) == four
    assert translate_document_streaming(model, tokenizer, SENTENCES, window=2, **eager) == streamed
    unset = GenerationConfig(min_length=0, max_new_tokens=8, num_beams=1)  # a passed 0 wins, as in generate()
    assert translate_documents(model, tokenizer, DOCUMENTS, window=3, generation_config=unset,
                               logits_processor=eager["logits_processor"]) == free


def test_a_configured_min_length_is_not_reported_once_per_window(tokenizer):
    """generate() logs "Both `min_new_tokens` and `min_length` seem to have been set" whenever the model's generation
    config sets min_length; document translation passes that min_length as each sentence's min_new_tokens, so the
    message would come once per window (per sentence) and say nothing: it is left out, other messages are not."""
    import logging

    model = model_for("talk", tokenizer)
    model.generation_config.min_length = 3
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("transformers.generation.utils")
    logger.addHandler(handler)
    try:
        translate_documents(model, tokenizer, DOCUMENTS, window=2, **GREEDY)
        translate_document_streaming(model, tokenizer, SENTENCES, window=2, **GREEDY)
        assert not [r for r in records if "min_new_tokens" in r.getMessage()]
        model.generate(**tokenizer(["a dog runs ."], return_tensors="pt"), min_new_tokens=2, max_new_tokens=4)
        assert [r for r in records if "min_new_tokens" in r.getMessage()]  # outside document translation it stays
    finally:
        logger.removeHandler(handler)


def by_hand_configured(model, tokenizer, sentences, window, positions, limit, shortened, forced_eos=False,
                       **generate_kwargs):
    """The sliding-window definition with a limit taken from the generation config (`limit` new tokens) and a
    model of `positions` positions: a window's sentence may take the limit within the positions its decoder start
    and forced prefix leave; a sentence those positions cut (no </s> or <sep> before them, short of the limit; with
    `forced_eos`, the model's generation config forcing </s> in the last position, a </s> there counts as none)
    is translated again with the window's oldest context sentence dropped (counted in the list `shortened`)."""
    start, eos = decoder_start(model, generate_kwargs), tokenizer.eos_token_id
    stops = {SEP_ID, eos}
    kept = []
    for i in range(len(sentences)):
        for first in range(max(0, i - window + 1), i + 1):
            source = tokenizer(join_sentences(sentences[first : i + 1]), return_tensors="pt")
            prefix = [t for ids in kept[first:] for t in ids + [SEP_ID]]
            room = min(limit, positions - len(start) - len(prefix))
            if source["input_ids"].shape[1] > positions or room < 1:
                continue
            out = model.generate(**source, decoder_input_ids=torch.tensor([start + prefix]), max_new_tokens=room,
                                 eos_token_id=[eos, SEP_ID], **generate_kwargs)
            new = out[0, len(start) + len(prefix) :].tolist()
            end = next((j for j, t in enumerate(new) if t in stops), None)
            cut = end is None or (forced_eos and end == room - 1 and new[end] == eos)
            if not cut or room == limit or first == i:
                break
        if first > max(0, i - window + 1):
            shortened.append(i)
        kept.append(new[:end])
    return [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in kept]


def test_a_sentence_cut_by_the_positions_under_a_configured_limit_drops_context(tokenizer):
    """A configured limit (max_length as long as the positions, as Hub Marian models set it) leaves a sentence
    after a long forced prefix few positions: a sentence they cut is translated again with less context, and the
    windows shortened are warned about, as for a given max_new_tokens."""
    model = model_for("marian", tokenizer, seed=4, max_position_embeddings=18)
    model.generation_config.max_length = 18
    stop = dict(num_beams=1, logits_processor=LogitsProcessorList([EndsSentencesAfter(14, tokenizer.eos_token_id)]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = translate_documents(model, tokenizer, DOCUMENTS, window=2, **stop)
    shortened = []
    assert got == [by_hand_configured(model, tokenizer, doc, 2, 18, 17, shortened, **stop) for doc in DOCUMENTS]
    assert shortened
    [record] = [w for w in caught if issubclass(w.category, ContextShortenedWarning)]
    assert (record.message.shortened, record.message.windows) == (len(shortened), sum(map(len, DOCUMENTS)))
    lengths, generate = [], model.generate

    def measured(**kwargs):
        out = generate(**kwargs)
        lengths.append(out.shape[1])
        return out

    model.generate = measured
    with warnings.catch_warnings(record=True) as caught:  # a forced BOS token (a target language code) takes a
        warnings.simplefilter("always")                    # position too: the same translations and the same count
        got = translate_documents(model, tokenizer, DOCUMENTS, window=2, forced_bos_token_id=7, **stop)
    assert max(lengths) == 18  # no decoder input past the model's positions (the retry would hide one)
    shortened = []
    assert got == [by_hand_configured(model, tokenizer, doc, 2, 18, 16, shortened, forced_bos_token_id=7, **stop)
                   for doc in DOCUMENTS]
    [record] = [w for w in caught if issubclass(w.category, ContextShortenedWarning)]
    assert shortened and record.message.shortened == len(shortened)


def test_a_forced_end_of_sequence_in_the_last_position_is_a_cut_sentence(tokenizer):
    """Hub Marian and BART generation configs set forced_eos_token_id to their </s>: generate() puts it in the last
    position a window leaves, so a sentence those positions cut ends with </s> there instead of running into them.
    It is a cut sentence all the same: translated again with less context and warned about, and the translations
    are those of the same model without the forced end (here no sentence ends there of itself)."""
    model = model_for("marian", tokenizer, seed=4, max_position_embeddings=18)
    model.generation_config.max_length = 18
    stop = dict(num_beams=1, logits_processor=LogitsProcessorList([EndsSentencesAfter(14, tokenizer.eos_token_id)]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextShortenedWarning)
        unforced = translate_documents(model, tokenizer, DOCUMENTS, window=2, **stop)
    model.generation_config.forced_eos_token_id = tokenizer.eos_token_id
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, count = translate_documents_counted(model, tokenizer, DOCUMENTS, window=2, **stop)
    shortened = []
    assert got == [by_hand_configured(model, tokenizer, doc, 2, 18, 17, shortened, forced_eos=True, **stop)
                   for doc in DOCUMENTS]
    assert got == unforced
    assert shortened and count == len(shortened)
    [record] = [w for w in caught if issubclass(w.category, ContextShortenedWarning)]
    assert record.message.shortened == len(shortened)


def test_token_ids_whatever_the_generation_config_returns(tokenizer):
    """return_dict_in_generate=True (with output_scores) in the model's generation config or in one passed makes
    generate() return a dict: document translation, its pipeline and the training evaluation's translate read
    token ids all the same, one sequence per input (num_return_sequences in the config too), and give the same
    translations; either setting as an argument of translate is refused by name."""
    from transformers import GenerationConfig, pipeline

    from talk_hf.training.evaluation import translate

    model = model_for("talk", tokenizer)
    plain = translate_documents(model, tokenizer, DOCUMENTS, window=2, **GREEDY)
    sentences = translate(model, tokenizer, SENTENCES[:3], num_beams=2, max_new_tokens=4)
    asked = GenerationConfig(return_dict_in_generate=True, output_scores=True, **GREEDY)
    assert translate_documents(model, tokenizer, DOCUMENTS, window=2, generation_config=asked) == plain
    model.generation_config.return_dict_in_generate = model.generation_config.output_scores = True
    assert translate_documents(model, tokenizer, DOCUMENTS, window=2, **GREEDY) == plain
    translator = pipeline("document-translation", model=model, tokenizer=tokenizer)
    assert translator(DOCUMENTS[0], window=2, **GREEDY) == {"translations": plain[0]}
    model.generation_config.num_beams, model.generation_config.num_return_sequences = 2, 2
    assert translate(model, tokenizer, SENTENCES[:3], num_beams=2, max_new_tokens=4) == sentences
    for name, value in (("return_dict_in_generate", True), ("num_return_sequences", 2)):
        with pytest.raises(ValueError, match=f"{name}: generate_translations returns one sequence"):
            translate(model, tokenizer, SENTENCES[:3], num_beams=2, max_new_tokens=4, **{name: value})


def test_streaming_refuses_to_run_without_the_cache(tokenizer):
    """Streaming carries the decoder state in generate()'s cache: use_cache=False, as an argument or in a
    generation config passed, would carry none and give other translations, so it is refused by name; a model
    whose own generation config says use_cache=False streams with the cache all the same."""
    from transformers import GenerationConfig

    model = model_for("rfa_doc", tokenizer, seed=2)
    expected = translate_document_streaming(model, tokenizer, SENTENCES, window=2, max_new_tokens=4)
    with pytest.raises(ValueError, match="use_cache must be True, got False"):
        translate_document_streaming(model, tokenizer, SENTENCES, window=2, max_new_tokens=4, use_cache=False)
    with pytest.raises(ValueError, match="use_cache must be True"):
        translate_document_streaming(model, tokenizer, SENTENCES, window=2,
                                     generation_config=GenerationConfig(use_cache=False, max_new_tokens=4))
    model.generation_config.use_cache = False
    assert translate_document_streaming(model, tokenizer, SENTENCES, window=2, max_new_tokens=4) == expected


def test_a_blank_sentence_is_translated_as_empty_and_left_out_of_the_windows(tokenizer):
    """A blank sentence (empty or whitespace only: a prepared split keeps blank lines as rows) gets "" and is in
    no window, as source context or forced prefix: the other sentences are translated as if it were absent, by
    either decoding, alone or in a batch."""
    model = model_for("rfa_doc", tokenizer, seed=2)
    with_blanks = ["", SENTENCES[0], " ", SENTENCES[1], SENTENCES[2], "\t", SENTENCES[3]]
    without = [s for s in with_blanks if s.strip()]
    blank = [not s.strip() for s in with_blanks]

    def placed(translations):
        it = iter(translations)
        return ["" if b else next(it) for b in blank]

    alone = translate_document(model, tokenizer, without, window=2, **GREEDY)
    assert any(alone)  # the sentences have words
    assert translate_document(model, tokenizer, with_blanks, window=2, **GREEDY) == placed(alone)
    assert translate_documents(model, tokenizer, [DOCUMENTS[0], with_blanks, ["", " "]], window=2, batch_size=3,
                               **GREEDY) == [translate_document(model, tokenizer, DOCUMENTS[0], window=2, **GREEDY),
                                             placed(alone), ["", ""]]
    streamed = translate_document_streaming(model, tokenizer, without, window=2, max_new_tokens=4)
    assert translate_document_streaming(model, tokenizer, with_blanks, window=2, max_new_tokens=4) == placed(streamed)


def test_a_gated_model_whose_separator_is_not_the_tokenizers_is_refused(tokenizer):
    """RFA-doc's gate fires at config.sep_token_id; windows joined with another token would never reach it."""
    model = model_for("rfa_doc", tokenizer)
    model.config.sep_token_id = 9
    with pytest.raises(ValueError, match=r"gates at sep_token_id=9.*'<sep>' \(id 4\)"):
        translate_document(model, tokenizer, SENTENCES[:3], window=2, **GREEDY)
    with pytest.raises(ValueError, match=r"gates at sep_token_id=9.*'<sep>' \(id 4\)"):
        translate_document_streaming(model, tokenizer, SENTENCES[:3], window=2, **GREEDY)
    assert translate_document(model, tokenizer, SENTENCES[:3], window=1, **GREEDY)  # no window separator


def test_generation_arguments_beside_a_generation_config_are_honoured_as_without_it(tokenizer):
    """Keyword arguments given beside a generation_config go into its copy, those that document translation sets
    for each sentence itself included (max_new_tokens and min_new_tokens, each new sentence's limits; the
    num_return_sequences=1, and for streaming num_beams=1 and use_cache=True, that the decoding requires): the
    translations are those of the same arguments without a config, in every decoding and the pipeline."""
    from transformers import GenerationConfig, pipeline

    model = model_for("talk", tokenizer)
    beams = dict(window=2, num_beams=2, max_new_tokens=4)
    plain = translate_documents(model, tokenizer, DOCUMENTS, **beams)
    assert plain != translate_documents(model, tokenizer, DOCUMENTS, window=2, num_beams=2)  # the limit matters
    config = GenerationConfig(num_beams=2)
    assert translate_documents(model, tokenizer, DOCUMENTS, window=2, generation_config=config,
                               max_new_tokens=4) == plain
    assert translate_document(model, tokenizer, DOCUMENTS[0], window=2, generation_config=config, max_new_tokens=4,
                              num_return_sequences=1) == plain[0]
    assert translate_document(model, tokenizer, DOCUMENTS[0], window=2, generation_config=config, max_new_tokens=4,
                              min_new_tokens=3) == translate_document(model, tokenizer, DOCUMENTS[0], min_new_tokens=3,
                                                                      **beams)
    assert config.max_new_tokens is None  # the caller's config is left as it was
    streamed = translate_document_streaming(model, tokenizer, SENTENCES, window=2, max_new_tokens=4)
    greedy = GenerationConfig(do_sample=False)
    assert translate_document_streaming(model, tokenizer, SENTENCES, window=2, generation_config=greedy,
                                        max_new_tokens=4) == streamed
    assert translate_document_streaming(model, tokenizer, SENTENCES, window=2, generation_config=greedy,
                                        max_new_tokens=4, num_beams=1, use_cache=True) == streamed
    translator = pipeline("document-translation", model=model, tokenizer=tokenizer)
    expected = [{"translations": t} for t in plain]
    assert translator(DOCUMENTS, window=2, generation_config=config, max_new_tokens=4) == expected
    assert translator(DOCUMENTS, window=2, batch_size=2, generation_config=config, max_new_tokens=4) == expected
    assert translator(SENTENCES, window=2, streaming=True, generation_config=greedy, max_new_tokens=4) == {
        "translations": streamed}
    # a value the decoding cannot take is refused by name, beside a config as without one
    with pytest.raises(ValueError, match="num_return_sequences must be 1"):
        translate_document(model, tokenizer, SENTENCES, window=2, generation_config=config, num_return_sequences=2)
    with pytest.raises(ValueError, match="num_beams must be 1"):
        translate_document_streaming(model, tokenizer, SENTENCES, window=2, generation_config=greedy, num_beams=2)


@pytest.mark.parametrize("kind", ["talk", "dynamic_conv", "rfa_doc"])
def test_streaming_with_a_static_cache_asked_for(kind, tokenizer, caplog):
    """cache_implementation="static" (an argument, in a generation config passed, or in the model's) makes the
    first sentence's cache, which the later sentences continue: the translations are those of the default cache,
    and generate() is not told both of a cache and of a cache implementation."""
    from transformers import GenerationConfig

    model = model_for(kind, tokenizer)
    sentences = SENTENCES[:3]
    expected = translate_document_streaming(model, tokenizer, sentences, window=2, **GREEDY)
    with caplog.at_level("WARNING"):
        assert translate_document_streaming(model, tokenizer, sentences, window=2, cache_implementation="static",
                                            **GREEDY) == expected
        assert translate_document_streaming(model, tokenizer, sentences, window=2, generation_config=GenerationConfig(
            cache_implementation="static", **GREEDY)) == expected
        model.generation_config.cache_implementation = "static"
        assert translate_document_streaming(model, tokenizer, sentences, window=2, **GREEDY) == expected
        assert translate_document_streaming(model, tokenizer, sentences, window=2,
                                            generation_config=GenerationConfig(**GREEDY)) == expected
    assert "together with generation-related arguments" not in caplog.text


class ForcesPad(LogitsProcessor):
    """Forces <pad> as the next token where the decoder input has `length` tokens (a model that emits <pad> inside a
    sentence)."""

    def __init__(self, length, pad):
        self.length, self.pad = length, pad

    def __call__(self, input_ids, scores):
        if input_ids.shape[1] == self.length:
            scores[:] = torch.where(torch.arange(scores.shape[1]) == self.pad, 0.0, -float("inf"))
        return scores


@pytest.mark.parametrize("kind", ["talk", "dynamic_conv", "rfa_doc", "marian"])
def test_a_pad_generated_inside_a_sentence_does_not_end_it(kind, tokenizer):
    """Only the end of sequence and the separator end a sentence, as for generate(): a <pad> the model generates
    is kept with the words after it, so window=1 is sentence-level translation (and a one-sentence document
    streams as generate() translates it)."""
    model = model_for(kind, tokenizer)
    pad = tokenizer.pad_token_id
    forced = dict(max_new_tokens=6, num_beams=1, logits_processor=LogitsProcessorList([ForcesPad(3, pad)]))
    sentence_level = []
    for sentence in SENTENCES[:2]:
        ids = model.generate(**tokenizer([sentence], return_tensors="pt"), **forced)[0].tolist()
        assert ids[3] == pad and len(ids) == 7 and tokenizer.eos_token_id not in ids[1:]  # words after the pad
        sentence_level.append(tokenizer.decode(ids, skip_special_tokens=True).strip())
    assert translate_document(model, tokenizer, SENTENCES[:2], window=1, **forced) == sentence_level
    assert translate_documents(model, tokenizer, [SENTENCES[:2], SENTENCES[1:2]], window=1, batch_size=2,
                               **forced) == [sentence_level, sentence_level[1:]]
    if kind != "marian":
        assert translate_document_streaming(model, tokenizer, SENTENCES[:1], window=1, **forced) == \
            sentence_level[:1]
        assert translate_document(model, tokenizer, SENTENCES[:3], window=2, **forced) == \
            by_hand(model, tokenizer, SENTENCES[:3], 2, **forced)


def test_a_row_stopped_before_the_others_keeps_none_of_the_batchs_padding(tokenizer):
    """A stopping criterion ends some windows of a batch before the others, which generate() pads: the padding is
    not part of those sentences (nor of the prefixes forced after them), so batched documents translate as one at
    a time."""
    model = model_for("talk", tokenizer, seed=3)
    documents = [SENTENCES[:3], SENTENCES[3:], SENTENCES[1:4]]
    stopping = dict(max_new_tokens=6, num_beams=1, do_sample=False,
                    stopping_criteria=StoppingCriteriaList([StopsAtToken(35)]))
    alone = [translate_documents_counted(model, tokenizer, [d], window=2, batch_size=1, **stopping) for d in documents]
    together = translate_documents_counted(model, tokenizer, documents, window=2, batch_size=3, **stopping)
    assert together == ([t for (t,), _ in alone], sum(shortened for _, shortened in alone))


def test_streaming_names_its_own_need_for_the_separator(tokenizer):
    """Streaming builds the decoder's history with the separator after every sentence, whatever the window: a
    tokenizer without it is refused with that reason (not "use window=1", which sliding windows take)."""
    model = model_for("talk", tokenizer)
    with pytest.raises(ValueError, match="no '<para>' token") as caught:
        translate_document_streaming(model, tokenizer, SENTENCES[:2], window=1, sep_token="<para>", **GREEDY)
    assert "streaming" in str(caught.value) and "window=1" not in str(caught.value)
    with pytest.raises(ValueError, match="no '<para>' token.*use window=1"):
        translate_document(model, tokenizer, SENTENCES[:2], window=2, sep_token="<para>", **GREEDY)
