"""The translation and summarization pipelines take what transformers 4's did: the config's prefix and
task_specific_params, src_lang/tgt_lang, return_tensors/return_text/clean_up_tokenization_spaces, a generate_kwargs
dict, and an empty list of inputs."""

import copy
import warnings

import pytest
import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteriaList, pipeline

from talk_hf import SummarizationPipeline, TranslationPipeline
from talk_hf.tokenization import train_joint_bpe
from tests.models.tiny import make
from tests.utils import StopsAtToken

SENTENCES = ["a dog runs in the park .", "it barks at a cat .", "the cat runs away .", "a man sees the dog .",
             "translate English to German : summarize : he calls it home ."]
SHORT = dict(max_new_tokens=3, min_new_tokens=3)


@pytest.fixture(scope="module")
def tokenizer():
    return train_joint_bpe(SENTENCES * 3, vocab_size=80, min_frequency=1)


def tiny(tokenizer, **config):
    return make("talk", vocab_size=len(tokenizer), **config)


def recording(model):
    """The model, whose generate() calls are recorded in the returned list as (encoder text, other kwargs)."""
    calls, generate = [], model.generate

    def record(*args, **kwargs):
        settings = {k: v for k, v in kwargs.items() if k not in ("input_ids", "attention_mask")}
        calls.append((kwargs["input_ids"], settings))
        return generate(*args, **kwargs)

    model.generate = record
    return calls


def encoded(tokenizer, calls):
    return [tokenizer.decode(ids[0], skip_special_tokens=True) for ids, _ in calls]


# --- task prefixes and task_specific_params ------------------------------------------------------------------------


def test_the_configs_prefix_is_put_before_each_input(tokenizer):
    model = tiny(tokenizer, prefix="translate English to German: ")
    calls = recording(model)
    translator = pipeline("translation", model=model, tokenizer=tokenizer)
    translator(["a dog runs .", "the cat ."], batch_size=2, **SHORT)
    [(ids, _)] = calls  # both inputs in one generate() call, each prefixed
    expected = tokenizer(["translate English to German: a dog runs .", "translate English to German: the cat ."],
                         padding=True, return_tensors="pt")["input_ids"]
    assert torch.equal(ids, expected)


def test_the_tasks_params_give_its_prefix_and_generation_defaults(tokenizer):
    params = {"summarization": {"prefix": "summarize: ", "num_beams": 2, "max_length": 7},
              "translation": {"prefix": "translate English to German: ", "num_beams": 3}}
    model = tiny(tokenizer, prefix="unused: ", task_specific_params=copy.deepcopy(params))
    calls = recording(model)
    summarizer = pipeline("summarization", model=model, tokenizer=tokenizer)
    summarizer("a dog runs .")
    assert encoded(tokenizer, calls)[-1].startswith("summarize") and calls[-1][1]["num_beams"] == 2
    assert calls[-1][1]["max_length"] == 7
    summarizer("a dog runs .", num_beams=1, **SHORT)  # the call's settings win; its length replaces the task's
    assert calls[-1][1]["num_beams"] == 1 and "max_length" not in calls[-1][1]
    pipeline("translation", model=model, tokenizer=tokenizer)("a dog runs .", **SHORT)
    assert encoded(tokenizer, calls)[-1].startswith("translate English to German") and calls[-1][1]["num_beams"] == 3
    assert model.config.task_specific_params == params  # read, not consumed


def test_translation_takes_the_first_language_pair_of_the_params_with_a_warning(tokenizer):
    params = {"translation_en_to_de": {"prefix": "translate English to German: ", "num_beams": 2},
              "translation_en_to_fr": {"prefix": "translate English to French: "}}
    model = tiny(tokenizer, task_specific_params=params)
    calls = recording(model)
    with pytest.warns(UserWarning, match="translation_en_to_de"):
        translator = pipeline("translation", model=model, tokenizer=tokenizer)
    translator("a dog runs .", **SHORT)
    assert encoded(tokenizer, calls)[-1].startswith("translate English to German") and calls[-1][1]["num_beams"] == 2


def test_a_translation_pair_task_name_picks_its_params_and_languages(tokenizer):
    params = {"translation_de_to_en": {"prefix": "translate German to English: "}}
    model = tiny(tokenizer, task_specific_params=params)
    calls = recording(model)
    translator = TranslationPipeline(model=model, tokenizer=tokenizer, task="translation_de_to_en")
    translator("a dog runs .", **SHORT)
    assert encoded(tokenizer, calls)[-1].startswith("translate German to English")
    languages = multilingual(tokenizer)
    TranslationPipeline(model=model, tokenizer=languages, task="translation_de_to_en")("a dog runs .", **SHORT)
    assert languages.asked == [("de", "en")]


# --- src_lang / tgt_lang -------------------------------------------------------------------------------------------


def multilingual(tokenizer):
    """A copy of `tokenizer` that builds translation inputs as NLLB's does: the target language forced first."""
    languages = copy.deepcopy(tokenizer)
    languages.asked = []

    def build(raw_inputs, return_tensors, src_lang, tgt_lang, **kwargs):
        languages.asked.append((src_lang, tgt_lang))
        inputs = languages(raw_inputs, return_tensors=return_tensors, **kwargs)
        inputs["forced_bos_token_id"] = languages.convert_tokens_to_ids("a")
        return inputs

    languages._build_translation_inputs = build
    return languages


def test_languages_go_to_a_tokenizer_that_builds_translation_inputs(tokenizer):
    languages = multilingual(tokenizer)
    model = tiny(tokenizer)
    calls = recording(model)
    translator = pipeline("translation", model=model, tokenizer=languages)
    out = translator(["a dog runs .", "the cat ."], src_lang="en", tgt_lang="a", max_new_tokens=3, batch_size=2)
    assert languages.asked == [("en", "a")] * 2 and len(out) == 2
    assert calls[-1][1]["forced_bos_token_id"] == languages.convert_tokens_to_ids("a")


def test_languages_for_a_tokenizer_without_them_are_refused_by_name(tokenizer):
    translator = pipeline("translation", model=tiny(tokenizer), tokenizer=tokenizer)
    with pytest.raises(ValueError, match=r"src_lang='de', tgt_lang='en'.*_build_translation_inputs"):
        translator("a dog runs .", src_lang="de", tgt_lang="en", **SHORT)
    with pytest.raises(ValueError, match=r"tgt_lang='en'"):
        pipeline("translation", model=tiny(tokenizer), tokenizer=tokenizer, tgt_lang="en")


# --- outputs -------------------------------------------------------------------------------------------------------


def test_return_tensors_and_return_text(tokenizer):
    model = tiny(tokenizer)
    translator = pipeline("translation", model=model, tokenizer=tokenizer)
    ids = model.generate(**tokenizer(["a dog runs ."], return_tensors="pt"), **SHORT)[0]
    text = tokenizer.decode(ids, skip_special_tokens=True).strip()
    [tensors] = translator("a dog runs .", return_tensors=True, **SHORT)
    assert set(tensors) == {"translation_token_ids"} and torch.equal(tensors["translation_token_ids"], ids)
    [both] = translator("a dog runs .", return_tensors=True, return_text=True, **SHORT)
    assert both["translation_text"] == text and torch.equal(both["translation_token_ids"], ids)
    assert translator("a dog runs .", return_text=True, **SHORT) == [{"translation_text": text}]
    with pytest.raises(ValueError, match="return_text=False without return_tensors=True"):
        translator("a dog runs .", return_text=False, **SHORT)
    built = pipeline("summarization", model=model, tokenizer=tokenizer, return_tensors=True)
    assert set(built("a dog runs .", return_text=True, **SHORT)[0]) == {"summary_token_ids", "summary_text"}
    assert set(built("a dog runs .", return_text=False, **SHORT)[0]) == {"summary_token_ids"}


def test_clean_up_tokenization_spaces_goes_to_decoding(tokenizer):
    cleaning = copy.deepcopy(tokenizer)
    asked, decode = [], cleaning.decode
    cleaning.decode = lambda *args, **kwargs: asked.append(kwargs.get("clean_up_tokenization_spaces")) or decode(
        *args, **kwargs)
    translator = pipeline("translation", model=tiny(tokenizer), tokenizer=cleaning)
    for value in (True, False):
        translator("a dog runs .", clean_up_tokenization_spaces=value, **SHORT)
        assert asked[-1] is value


def test_a_generate_kwargs_dict_joins_the_generation_arguments(tokenizer):
    translator = pipeline("translation", model=tiny(tokenizer), tokenizer=tokenizer)
    direct = translator("a dog runs .", num_beams=2, **SHORT)
    assert translator("a dog runs .", generate_kwargs=dict(num_beams=2, **SHORT)) == direct
    assert translator("a dog runs .", generate_kwargs=dict(num_beams=2, max_new_tokens=9), **SHORT) == direct
    built = pipeline("translation", model=tiny(tokenizer), tokenizer=tokenizer, generate_kwargs=dict(num_beams=2))
    assert built("a dog runs .", **SHORT) == direct
    with pytest.raises(TypeError, match="generate_kwargs must be a dict"):
        translator("a dog runs .", generate_kwargs=[("num_beams", 2)])


def test_the_document_translation_pipeline_takes_a_generate_kwargs_dict(tokenizer):
    """As pipeline("translation") does: a generate_kwargs dict joins the generation arguments, in a call (with or
    without batch_size) and when the pipeline is built, a keyword given beside it winning."""
    model = tiny(tokenizer).eval()
    documents = [SENTENCES[:2], SENTENCES[2:4]]
    translator = pipeline("document-translation", model=model, tokenizer=tokenizer)
    direct = translator(documents, window=2, num_beams=2, **SHORT)
    assert translator(documents, window=2, generate_kwargs=dict(num_beams=2, **SHORT)) == direct
    assert translator(documents, window=2, batch_size=2, generate_kwargs=dict(num_beams=2, **SHORT)) == direct
    assert translator(documents, window=2, generate_kwargs=dict(num_beams=2, max_new_tokens=9), **SHORT) == direct
    built = pipeline("document-translation", model=model, tokenizer=tokenizer, generate_kwargs=dict(num_beams=2))
    assert built(documents, window=2, **SHORT) == direct
    assert built(documents, window=2, batch_size=2, **SHORT) == direct
    with pytest.raises(TypeError, match="generate_kwargs must be a dict"):
        translator(documents, window=2, generate_kwargs=[("num_beams", 2)])


@pytest.mark.parametrize("task", ["translation", "summarization"])
def test_an_empty_list_of_inputs_gives_an_empty_list(task, tokenizer):
    pipe = pipeline(task, model=tiny(tokenizer), tokenizer=tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pipe([], **SHORT) == [] and pipe([], batch_size=2) == []


def test_the_pipelines_keep_their_output_keys(tokenizer):
    model = tiny(tokenizer)
    assert isinstance(pipeline("summarization", model=model, tokenizer=tokenizer), SummarizationPipeline)
    assert set(pipeline("summarization", model=model, tokenizer=tokenizer)("a dog .", **SHORT)[0]) == {"summary_text"}


def test_documents_written_with_any_line_break_are_each_a_document(tokenizer):
    """A list of str is several documents when one holds a line break: "\n", "\r\n" or "\r", as a document's str
    is split (`document_sentences`)."""
    from talk_hf import translate_documents

    model = tiny(tokenizer).eval()
    translator = pipeline("document-translation", model=model, tokenizer=tokenizer)
    documents = [SENTENCES[:2], SENTENCES[2:4]]
    expected = [{"translations": t} for t in translate_documents(model, tokenizer, documents, window=2, **SHORT)]
    for line_break in ("\n", "\r\n", "\r"):
        assert translator([line_break.join(d) for d in documents], window=2, **SHORT) == expected


def test_lines_read_with_their_line_ends_are_one_document(tokenizer):
    """`f.readlines()` keeps each line's end: a list of str whose line breaks all end their str is one document's
    sentences, translated as the same lines without them (a line break inside a str makes the list documents)."""
    from talk_hf import translate_document

    model = tiny(tokenizer).eval()
    translator = pipeline("document-translation", model=model, tokenizer=tokenizer)
    expected = {"translations": translate_document(model, tokenizer, SENTENCES[:3], window=2, **SHORT)}
    for line_end in ("\n", "\r\n", "\r"):
        assert translator([s + line_end for s in SENTENCES[:3]], window=2, **SHORT) == expected


# --- long sources and generate() outputs ---------------------------------------------------------------------------


def test_a_long_source_is_kept_whole_by_a_model_without_a_position_limit(tokenizer):
    """The talk_hf models' sinusoidal positions take any length: a source past the tokenizer's model_max_length is
    translated whole, not cut; truncation=True cuts it there, as asked."""
    model = tiny(tokenizer)
    calls = recording(model)
    short = copy.deepcopy(tokenizer)
    short.model_max_length = 8
    long = " ".join(SENTENCES[:3])
    length = len(tokenizer(long)["input_ids"])
    assert length > 8
    translator = pipeline("translation", model=model, tokenizer=short)
    translator(long, **SHORT)
    translator(long, truncation=True, **SHORT)
    assert [ids.shape[-1] for ids, _ in calls] == [length, 8]


def test_a_source_past_the_models_positions_is_cut_to_them_with_a_warning(tokenizer):
    """A model with a position limit (Marian's max_position_embeddings) gets its source cut to it, said in a
    warning naming both lengths; truncation=False passes it whole."""
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(0)
    model = MarianMTModel(MarianConfig(vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1,
                                       encoder_ffn_dim=16, decoder_ffn_dim=16, encoder_attention_heads=2,
                                       decoder_attention_heads=2, max_position_embeddings=12, pad_token_id=1,
                                       eos_token_id=2, decoder_start_token_id=2)).eval()
    calls = recording(model)
    long = " ".join(SENTENCES[:3])
    assert len(tokenizer(long)["input_ids"]) > 12
    translator = pipeline("translation", model=model, tokenizer=tokenizer)
    with pytest.warns(UserWarning, match="a source longer than the model's 12 positions is cut to them"):
        translator(long, **SHORT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        translator(SENTENCES[0], **SHORT)
    assert [ids.shape[-1] for ids, _ in calls] == [12, len(tokenizer(SENTENCES[0])["input_ids"])]
    assert calls[0][0][0, -1] == tokenizer.eos_token_id  # cut by the tokenizer: the source still ends with </s>


def test_generate_outputs_as_a_dict_give_the_same_translations_and_their_scores(tokenizer):
    """return_dict_in_generate=True (passed, or in the model's generation config): the translations are the
    sequences', and each record carries its own sequence's outputs: under beam search sequences_scores,
    beam_indices and the per-step scores of its input's beams, otherwise its per-step scores; the encoder's outputs
    are left out."""
    model = tiny(tokenizer)
    translator = pipeline("translation", model=model, tokenizer=tokenizer)
    beams = dict(num_beams=3, num_return_sequences=2, **SHORT)
    plain = translator(SENTENCES[:2], **beams)
    scored = translator(SENTENCES[:2], return_dict_in_generate=True, output_scores=True, batch_size=2, **beams)
    assert [[r["translation_text"] for r in rows] for rows in scored] == [
        [r["translation_text"] for r in rows] for rows in plain]
    out = model.generate(**tokenizer(SENTENCES[:1], return_tensors="pt"), return_dict_in_generate=True,
                         output_scores=True, **beams)
    for i, record in enumerate(scored[0]):
        assert set(record) == {"translation_text", "sequences_scores", "beam_indices", "scores"}
        assert torch.allclose(record["sequences_scores"], out.sequences_scores[i])
        assert torch.equal(record["beam_indices"], out.beam_indices[i])
        steps = out.beam_indices.shape[1]  # the steps of the input's sequences (the search may run past them)
        assert torch.allclose(record["scores"], torch.stack(out.scores, dim=1)[:, :steps])
    [greedy] = translator(SENTENCES[0], return_dict_in_generate=True, output_scores=True, output_hidden_states=True,
                          **SHORT)
    out = model.generate(**tokenizer(SENTENCES[:1], return_tensors="pt"), return_dict_in_generate=True,
                         output_scores=True, **SHORT)
    assert set(greedy) == {"translation_text", "scores"}
    assert torch.equal(greedy["scores"], torch.stack(out.scores, dim=1)[0])
    model.generation_config.return_dict_in_generate = True
    assert translator(SENTENCES[0], **SHORT) == translator(SENTENCES[0], return_dict_in_generate=False, **SHORT)


def test_truncation_takes_the_tokenizers_strategies(tokenizer):
    """truncation="do_not_truncate" (transformers 4's documented value) keeps the source whole, as False does."""
    from transformers.tokenization_utils_base import TruncationStrategy

    model = tiny(tokenizer)
    calls = recording(model)
    short = copy.deepcopy(tokenizer)
    short.model_max_length = 8
    long = " ".join(SENTENCES[:3])
    translator = pipeline("translation", model=model, tokenizer=short)
    for truncation in ("do_not_truncate", TruncationStrategy.DO_NOT_TRUNCATE, False, "longest_first", True):
        translator(long, truncation=truncation, **SHORT)
    length = len(tokenizer(long)["input_ids"])
    assert [ids.shape[-1] for ids, _ in calls] == [length] * 3 + [8] * 2


class EndsByFirstToken(LogitsProcessor):
    """Forces the end of sequence once a sequence has (its first generated token mod 4) + 1 tokens after the start
    token: sequences of a batch that end at different steps."""

    def __init__(self, eos):
        self.eos = eos

    def __call__(self, input_ids, scores):
        for row, ids in enumerate(input_ids.tolist()):
            if len(ids) > 1 and len(ids) - 1 >= ids[1] % 4 + 1:
                scores[row] = torch.where(torch.arange(scores.shape[1]) == self.eos, 0.0, -float("inf"))
        return scores


def assert_records_equal(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        if isinstance(b, list):
            assert_records_equal(a, b)
            continue
        assert set(a) == set(b)
        for key, value in b.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                assert a[key].shape == value.shape and torch.allclose(a[key], value, atol=1e-5), key
            elif isinstance(value, torch.Tensor):
                assert torch.equal(a[key], value), key
            else:
                assert a[key] == value, key


def test_a_records_outputs_are_those_of_a_batch_of_one(tokenizer):
    """Each record holds its own sequence's outputs whatever the batch it was generated in: token ids up to the end
    of sequence of its input's longest sequence, per-step scores and logits of those steps (not the padding and
    the steps of the longer sequences of its batch), and under beam search beam indices among its own input's
    beams, with the scores of those beams, from which `model.compute_transition_scores` gives the sequence's."""
    model = tiny(tokenizer, seed=2)
    translator = pipeline("translation", model=model, tokenizer=tokenizer)
    sources = SENTENCES + ["a dog", "."]
    ending = dict(max_new_tokens=8, sequence_bias={(tokenizer.eos_token_id,): -3.0},
                  logits_processor=LogitsProcessorList([EndsByFirstToken(tokenizer.eos_token_id)]))
    outputs = dict(return_tensors=True, return_dict_in_generate=True, output_scores=True, output_logits=True)
    plain = translator(sources, batch_size=1, return_tensors=True, **ending)
    assert len({len(r["translation_token_ids"]) for r in plain}) > 1  # the sequences end at different steps
    assert_records_equal(translator(sources, batch_size=4, return_tensors=True, **ending), plain)
    greedy = translator(sources, batch_size=1, **outputs, **ending)
    for record in greedy:
        steps = len(record["translation_token_ids"]) - 1
        assert record["scores"].shape[0] == record["logits"].shape[0] == steps
    for batch_size in (4, len(sources)):
        assert_records_equal(translator(sources, batch_size=batch_size, **outputs, **ending), greedy)
    beams = dict(num_beams=3, num_return_sequences=2, **ending)
    one = translator(sources, batch_size=1, **outputs, **beams)
    assert_records_equal(translator(sources, batch_size=4, **outputs, **beams), one)
    for records in one:
        ids = torch.stack([r["translation_token_ids"] for r in records])
        beam_indices = torch.stack([r["beam_indices"] for r in records])
        assert beam_indices.max() < 3 and records[0]["scores"].shape[:2] == (3, beam_indices.shape[1])
        transition = model.compute_transition_scores(ids, records[0]["scores"].unbind(1), beam_indices)
        lengths = (beam_indices >= 0).sum(-1)
        scores = torch.stack([r["sequences_scores"] for r in records])
        assert torch.allclose(transition.sum(-1) / lengths, scores, atol=1e-5)


def test_a_record_stopped_before_its_batch_leaves_out_the_padding(tokenizer):
    """A stopping criterion ends some sequences of a batch without an end of sequence, and generate() pads them to
    the batch's longest: the records leave that padding (and the scores of its steps) out, as a batch of one."""
    translator = pipeline("translation", model=tiny(tokenizer, seed=2), tokenizer=tokenizer)
    sources = SENTENCES + ["a dog", "."]
    stopping = dict(max_new_tokens=8, stopping_criteria=StoppingCriteriaList([StopsAtToken(37)]))
    outputs = dict(return_tensors=True, return_dict_in_generate=True, output_scores=True)
    alone = translator(sources, batch_size=1, **outputs, **stopping)
    assert len({len(r["translation_token_ids"]) for r in alone}) > 1  # some sequences stopped early
    assert_records_equal(translator(sources, batch_size=len(sources), **outputs, **stopping), alone)


def test_the_document_translation_pipeline_takes_num_workers_with_or_without_batch_size(tokenizer):
    """num_workers is the pipeline's own argument (its DataLoader's workers), never a generate() one: taken with
    batch_size as without it."""
    model = tiny(tokenizer).eval()
    documents = [SENTENCES[:2], SENTENCES[2:4]]
    translator = pipeline("document-translation", model=model, tokenizer=tokenizer)
    expected = translator(documents, window=2, **SHORT)
    assert translator(documents, window=2, num_workers=0, **SHORT) == expected
    assert translator(documents, window=2, batch_size=2, num_workers=0, **SHORT) == expected
    built = pipeline("document-translation", model=model, tokenizer=tokenizer, num_workers=0, **SHORT)
    assert built(documents, window=2) == expected and built(documents, window=2, batch_size=2) == expected
