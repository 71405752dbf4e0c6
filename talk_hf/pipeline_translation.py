"""`pipeline("translation")` and `pipeline("summarization")` for the talk_hf encoder-decoders, and
`pipeline("document-translation")` for any encoder-decoder trained on sentence windows (document_translation.py).

transformers 5 removed the first two tasks; importing this module registers them again, and the third. Every talk_hf
config module imports it, so the tasks exist as soon as a talk_hf config is loaded, from the package or as Hub
remote code (`pipeline("translation", model=repo, trust_remote_code=True)` without the talk_hf package).

The translation and summarization pipelines take what transformers 4's did: the model config's `prefix` and its
`task_specific_params` for the task (a prefix and generation settings), `src_lang`/`tgt_lang` for tokenizers that
build translation inputs (`_build_translation_inputs`: mBART, NLLB, M2M100, ...), `return_tensors`, `return_text`,
`clean_up_tokenization_spaces` and `generate_kwargs={...}`. transformers 5's `pipeline()` refuses task names such as
"translation_de_to_en" before a pipeline class is looked up, so the languages are given as `src_lang`/`tgt_lang`;
a pipeline built directly (`TranslationPipeline(model, tokenizer, task="translation_de_to_en")`) reads them from
the task name.
"""

import warnings

import torch
from transformers import AutoModelForSeq2SeqLM, Pipeline
from transformers.generation import GenerateBeamDecoderOnlyOutput, GenerateBeamEncoderDecoderOutput
from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS
from transformers.utils import ModelOutput

from .document_translation import (
    document_sentences,
    generation_setting,
    position_limits,
    translate_document,
    translate_document_streaming,
    translate_documents,
)
from .tokenization import LINE_BREAK

LENGTH_SETTINGS = ("max_length", "max_new_tokens")


def translation_languages(task):
    """"translation_de_to_en" -> ("de", "en"); any other task name -> None."""
    parts = (task or "").split("_")
    if len(parts) == 4 and parts[0] == "translation" and parts[2] == "to":
        return parts[1], parts[3]
    return None


def given(**settings):
    """The settings that are not None."""
    return {key: value for key, value in settings.items() if value is not None}


def generation_arguments(generate_kwargs, kwargs):
    """A `generate_kwargs={...}` dict and the generation keywords given beside it, the latter winning (as
    transformers' speech recognition pipeline merges them)."""
    if generate_kwargs is None:
        return kwargs
    if not isinstance(generate_kwargs, dict):
        raise TypeError(f"generate_kwargs must be a dict of generate() arguments, got {type(generate_kwargs).__name__}")
    return {**generate_kwargs, **kwargs}


class Text2TextPipeline(Pipeline):
    """Text(s) in, [{"<return_name>_text": ...}] out, with a seq2seq model's `generate()`: the pipeline behind
    TranslationPipeline and SummarizationPipeline.

    The model config's `prefix` is put before every input, unless the config's `task_specific_params` for the task
    give one; the other settings there (num_beams, max_length, ...) are generation defaults under those of the
    pipeline and of each call (a `generation_config` passed replaces them; a length set by the caller, max_length or
    max_new_tokens, replaces theirs). Keyword arguments: truncation (default: a source longer than the model's
    positions, max_source_positions or max_position_embeddings, is cut to them with a warning, and a model without a
    limit, as the talk_hf models, takes it whole; True: cut at the tokenizer's model_max_length; False: never cut);
    return_tensors (token ids under "<return_name>_token_ids"); return_text (default: not return_tensors);
    clean_up_tokenization_spaces (for decoding; default: the tokenizer's); generate_kwargs (a dict); any other keyword
    goes to `model.generate` (num_beams, max_new_tokens, num_return_sequences, ...). With return_dict_in_generate
    (passed or in the model's generation config), each record also holds its sequence's own outputs: under beam
    search sequences_scores, beam_indices (counted among its input's beams, 0 .. num_beams - 1; -1 past the
    sequence's end) and, when generate() gives them, the per-step scores and logits of its input's beams,
    (num_beams, steps, vocabulary): they belong to the beams of each step, not to a returned sequence, and
    `model.compute_transition_scores(ids, scores.unbind(1), beam_indices)` maps them to the sequences, with the
    token ids (return_tensors) and beam_indices of all the input's records stacked as ids and beam_indices;
    otherwise the per-step scores and logits of its sequence, (steps, vocabulary). The encoder's and per-layer
    outputs are left out. A record's outputs do not depend on the batch it was generated in (sampling aside;
    scores up to rounding): its token ids, beam indices, scores and logits cover the steps of its input's
    sequences, to the end of the longest (as generate() gives the token ids of that input alone), and leave out the
    padding and any later step of its batch's generation."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True
    default_task = None
    return_name = None

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.task_name, task_params = self._task_settings()
        self.prefix = task_params.pop("prefix", getattr(self.model.config, "prefix", None))
        self.task_generate_kwargs = task_params

    def _task_settings(self):
        """-> (the task, a copy of the config's task_specific_params for it): the "translation" task of a model
        whose params have no "translation" entry takes their first "translation_XX_to_YY" one, with a warning (as
        transformers 4's pipeline() did)."""
        task = self.task or self.default_task
        params = getattr(self.model.config, "task_specific_params", None) or {}
        if task == "translation" and task not in params:
            pairs = [name for name in params if translation_languages(name)]
            if pairs:
                warnings.warn(f'the "translation" task uses the model\'s task_specific_params["{pairs[0]}"] '
                              f"(its prefix and generation settings); of {pairs}", UserWarning, stacklevel=3)
                task = pairs[0]
        return task, dict(params.get(task) or {})

    def _sanitize_parameters(self, truncation=None, return_tensors=None, return_text=None,
                             clean_up_tokenization_spaces=None, generate_kwargs=None, **kwargs):
        postprocess = given(return_tensors=return_tensors, return_text=return_text,
                            clean_up_tokenization_spaces=clean_up_tokenization_spaces)
        # a call's output settings go over those given when the pipeline was built (none while it is being built)
        check_outputs({**getattr(self, "_postprocess_params", {}), **postprocess})
        return given(truncation=truncation), generation_arguments(generate_kwargs, kwargs), postprocess

    def preprocess(self, text, truncation=None):
        text = self._prefixed(text)
        return self._encode(lambda **cut: self.tokenizer(text, return_tensors="pt", **cut), truncation)

    def _prefixed(self, text):
        if not isinstance(text, str):
            raise TypeError(f"{type(self).__name__} takes a string or a list of strings, got {type(text).__name__}")
        return (self.prefix or "") + text

    def _encode(self, encode, truncation):
        """encode(truncation=..., max_length=...) -> the model inputs, cut as `truncation` says (class docstring)."""
        inputs = encode(truncation=False if truncation is None else truncation)
        limit, length = position_limits(self.model.config)[0], inputs["input_ids"].shape[-1]
        if truncation is None and limit is not None and length > limit:
            warnings.warn(f"a source longer than the model's {limit} positions is cut to them; pass truncation=False "
                          "to keep it whole (for a model that takes it) or translate shorter parts", UserWarning,
                          stacklevel=2)
            inputs = encode(truncation=True, max_length=limit)
        inputs.pop("token_type_ids", None)  # a tokenizer output that generate() does not take
        return inputs

    def _forward(self, model_inputs, **generate_kwargs):
        """-> {"output_ids": one (sequences, T) tensor per input} and, from a dict output of generate(), its
        per-sequence outputs, one tensor per input alike (`sequence_outputs`), each cut to the steps its input's
        sequences take (`own_outputs`): lists, which the pipeline's batches split into their inputs."""
        model_inputs = {key: unbatched(value) for key, value in model_inputs.items()}
        generate_kwargs = self._with_task_settings(generate_kwargs)
        output = self.model.generate(**model_inputs, **generate_kwargs)
        inputs = model_inputs["input_ids"].shape[0]
        configs = (generate_kwargs.get("generation_config"), self.model.generation_config)
        num_beams, ends, pad = (generation_setting(generate_kwargs, name, *configs)
                                for name in ("num_beams", "eos_token_id", "pad_token_id"))
        prompt = self._prompt_length(model_inputs, generate_kwargs)
        return own_outputs(output, inputs, prompt, num_beams or 1, ends, pad)

    def _prompt_length(self, model_inputs, generate_kwargs):
        """The ids a generated sequence begins with, not generated: the decoder input (the start token, or the
        decoder_input_ids passed) of an encoder-decoder, the input of a decoder-only model."""
        if not self.model.config.is_encoder_decoder:
            return model_inputs["input_ids"].shape[-1]
        given = generate_kwargs.get("decoder_input_ids")
        return 1 if given is None else given.shape[-1]

    def _with_task_settings(self, generate_kwargs):
        """The generation arguments over the task's settings (see the class docstring)."""
        if "generation_config" in generate_kwargs:
            return generate_kwargs
        defaults = self.task_generate_kwargs
        if any(key in generate_kwargs for key in LENGTH_SETTINGS):
            defaults = {key: value for key, value in defaults.items() if key not in LENGTH_SETTINGS}
        return {**defaults, **generate_kwargs}

    def postprocess(self, model_outputs, return_tensors=False, return_text=None, clean_up_tokenization_spaces=None):
        return_text = not return_tensors if return_text is None else return_text
        decode = {} if clean_up_tokenization_spaces is None else {
            "clean_up_tokenization_spaces": clean_up_tokenization_spaces}
        records = []
        outputs = {key: value for key, value in model_outputs.items() if key != "output_ids"}
        for i, ids in enumerate(model_outputs["output_ids"][0]):
            record = {f"{self.return_name}_token_ids": ids} if return_tensors else {}
            if return_text:
                text = self.tokenizer.decode(ids, skip_special_tokens=True, **decode)
                record[f"{self.return_name}_text"] = text.strip()
            record.update({key: value[0][i] for key, value in outputs.items()})
            records.append(record)
        return records

    def __call__(self, inputs, **kwargs):
        """A string -> [{"<return_name>_text": ...}]; a list of strings -> one dict per input (a list of dicts per
        input when num_return_sequences > 1); an empty list -> []."""
        if isinstance(inputs, list) and not inputs:  # the settings are still checked
            self._sanitize_parameters(**{k: v for k, v in kwargs.items() if k not in ("batch_size", "num_workers")})
            return []
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(r) == 1 for r in result):
            return [r[0] for r in result]
        return result


def per_input(tensor, inputs):
    """(inputs * rows per input, ...) -> (inputs, rows per input, ...): the rows of each input (its returned
    sequences, or under beam search its beams) together."""
    return tensor.reshape(inputs, tensor.shape[0] // inputs, *tensor.shape[1:])


def own_outputs(output, inputs, prompt, num_beams, ends, pad=None):
    """generate()'s output (its sequences, and from a dict output `sequence_outputs`) -> {"output_ids": [...],
    key: [...]}, one tensor per input, the same whatever the batch: each cut to the steps that its input's
    sequences take (to the end of the longest, as generate() gives that input's token ids alone), not those of the
    longer sequences of its batch. A sequence's steps: under beam search its beam indices that are not -1
    (generate()'s mark of a step past its end), otherwise `generated_lengths` (up to its first end-of-sequence id
    of `ends`, an id or a list, the padding after it left out; `pad`: the padding id). prompt: the ids a sequence
    begins with, not generated."""
    dict_output = isinstance(output, ModelOutput)  # else the sequences alone
    ids = per_input(output.sequences if dict_output else output, inputs)
    beam_indices = output.get("beam_indices") if dict_output else None
    if beam_indices is not None:
        steps = (per_input(beam_indices, inputs) >= 0).sum(-1)
    else:
        steps = generated_lengths(ids[..., prompt:], ends, pad)
    steps = steps.amax(-1).tolist()
    own = {"output_ids": [ids[i, :, : prompt + n] for i, n in enumerate(steps)]}
    for key, (value, axis) in (sequence_outputs(output, inputs, num_beams) if dict_output else {}).items():
        own[key] = [value[i] if axis is None else value[i].narrow(axis, 0, n) for i, n in enumerate(steps)]
    return own


def generated_lengths(new_ids, ends, pad=None):
    """(..., steps) generated ids -> (...) how many of them each sequence generated: up to and with its first id of
    `ends` (an id, a list of them, or None); where it has none, all of them but a trailing run of `pad` ids (the
    padding after a sequence that a stopping criterion ended before the others of its batch)."""
    steps = new_ids.shape[-1]
    unended = torch.full(new_ids.shape[:-1], steps, device=new_ids.device)
    if pad is not None and steps:
        unended = ((new_ids != pad) * torch.arange(1, steps + 1, device=new_ids.device)).amax(-1)
    if ends is None:
        return unended
    ends = torch.as_tensor(ends if isinstance(ends, (list, tuple)) else [ends], device=new_ids.device).flatten()
    ended = torch.isin(new_ids, ends)
    return torch.where(ended.any(-1), ended.int().argmax(-1) + 1, unended)


def sequence_outputs(output, inputs, num_beams):
    """generate()'s dict output -> {key: ((inputs, sequences per input, ...) tensor, its step axis after the
    input's, or None)} for the outputs it holds per returned sequence: sequences_scores and beam_indices under beam
    search, each beam index counted among its own input's beams (generate() numbers a batch's beams together:
    input * num_beams + beam); per-step scores and logits, each a tuple of per-step (rows, vocabulary) tensors,
    stacked over the steps: otherwise one row per sequence, (steps, vocabulary), and under beam search one per beam
    of the step, all the input's beams with each of its sequences, (num_beams, steps, vocabulary), which
    `model.compute_transition_scores` takes with the sequences' token ids and beam indices."""
    beam = isinstance(output, (GenerateBeamEncoderDecoderOutput, GenerateBeamDecoderOnlyOutput))
    sequences = output.sequences.shape[0] // inputs
    outputs = {}
    if beam and output.get("sequences_scores") is not None:
        outputs["sequences_scores"] = (per_input(output.sequences_scores, inputs), None)
    if beam and output.get("beam_indices") is not None:
        indices = per_input(output.beam_indices, inputs)
        first = (torch.arange(inputs, device=indices.device) * num_beams).view(-1, 1, 1)
        outputs["beam_indices"] = (torch.where(indices >= 0, indices - first, indices), 1)
    for key in ("scores", "logits"):
        if output.get(key) is None:
            continue
        stacked = per_input(torch.stack(output[key], dim=1), inputs)
        if beam:  # (inputs, num_beams, steps, vocabulary): the input's beams, with each of its sequences
            outputs[key] = (stacked.unsqueeze(1).expand(-1, sequences, *stacked.shape[1:]), 2)
        else:
            outputs[key] = (stacked, 1)
    return outputs


def unbatched(value):
    """A setting that a tokenizer adds to each input (NLLB's forced_bos_token_id, an int) comes out of the pipeline's
    batching as a list of equal values: one value again. Tensors and other values pass unchanged."""
    if not isinstance(value, list) or not value or isinstance(value[0], torch.Tensor):
        return value
    return value[0] if value.count(value[0]) == len(value) else value


def check_outputs(postprocess):
    """Refuse return_text=False without return_tensors=True: nothing would be returned."""
    if postprocess.get("return_text") is False and not postprocess.get("return_tensors"):
        raise ValueError("return_text=False without return_tensors=True leaves nothing to return; pass "
                         "return_tensors=True for the token ids")


class TranslationPipeline(Text2TextPipeline):
    """Text(s) in, [{"translation_text": ...}] out (see Text2TextPipeline for the keyword arguments), and
    src_lang/tgt_lang for a tokenizer that builds translation inputs (`_build_translation_inputs`, as mBART's, NLLB's
    and M2M100's do); a "translation_XX_to_YY" task name gives their defaults."""

    default_task = "translation"
    return_name = "translation"

    def _sanitize_parameters(self, src_lang=None, tgt_lang=None, **kwargs):
        preprocess, forward, postprocess = super()._sanitize_parameters(**kwargs)
        languages = given(src_lang=src_lang, tgt_lang=tgt_lang)
        if languages and not hasattr(self.tokenizer, "_build_translation_inputs"):
            named = ", ".join(f"{key}={value!r}" for key, value in languages.items())
            raise ValueError(f"{named}: {type(self.tokenizer).__name__} does not take source and target languages (it "
                             "has no _build_translation_inputs, as multilingual tokenizers such as NLLB's have); leave "
                             "them out for a single-pair model")
        return {**preprocess, **languages}, forward, postprocess

    def preprocess(self, text, truncation=None, src_lang=None, tgt_lang=None):
        build = getattr(self.tokenizer, "_build_translation_inputs", None)
        if build is None:
            return super().preprocess(text, truncation)
        text = self._prefixed(text)
        task_src, task_tgt = translation_languages(self.task_name) or (None, None)
        languages = dict(src_lang=src_lang or task_src, tgt_lang=tgt_lang or task_tgt)
        return self._encode(lambda **cut: build(text, return_tensors="pt", **languages, **cut), truncation)


class SummarizationPipeline(Text2TextPipeline):
    """As TranslationPipeline without languages, with outputs under "summary_text"."""

    default_task = "summarization"
    return_name = "summary"


class DocumentTranslationPipeline(Pipeline):
    """A document in, one translation per sentence out: {"translations": [...]}. A document is a list of sentences
    or a string with one sentence per line; a list of documents gives one dict per document (a list of str is one
    document's sentences, unless one of them holds a line break, "\n", "\r\n" or "\r", before its end: then each
    is a document; the lines of `f.readlines()`, each ending in one, are one document).

    window (default 4): sentences per window, the current one included; streaming=True carries the decoder state
    across sentences (talk_hf models) instead of sliding windows; batch_size: sliding windows of several documents
    per `generate()` call (`talk_hf.translate_documents`; without it, one document at a time); other keyword
    arguments go to `model.generate` (num_beams, max_new_tokens per sentence, ...), as do those of a
    `generate_kwargs={...}` dict (a keyword given beside it wins, as in pipeline("translation"))."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(self, window=None, streaming=None, generate_kwargs=None, **kwargs):
        """Forward parameters, generation arguments among them (`generation_arguments`: a generate_kwargs dict and
        the keywords beside it), each its own key: the pipeline merges a call's over those given when it was built,
        key by key."""
        forward = dict(generation_arguments(generate_kwargs, kwargs))
        forward.update({k: v for k, v in (("window", window), ("streaming", streaming)) if v is not None})
        return {}, forward, {}

    def preprocess(self, document):
        return {"sentences": document_sentences(document)}

    def _forward(self, model_inputs, window=4, streaming=False, **generate_kwargs):
        translate = translate_document_streaming if streaming else translate_document
        return {"translations": translate(self.model, self.tokenizer, model_inputs["sentences"], window=window,
                                          **generate_kwargs)}

    def postprocess(self, model_outputs):
        return {"translations": model_outputs["translations"]}

    def __call__(self, documents, batch_size=None, num_workers=None, **kwargs):
        """One document (a str, or a list of str) -> {"translations": [...]}; a list of documents -> a list.

        num_workers: the pipeline's own (the workers of the DataLoader that feeds it one document at a time), never
        a generate() argument; with batch_size the documents go to `translate_documents` in this process, which
        has no DataLoader, so it is taken and has no effect."""
        single = isinstance(documents, str) or (
            isinstance(documents, (list, tuple)) and all(isinstance(s, str) for s in documents)
            and not any(LINE_BREAK.search(s.rstrip("\r\n")) for s in documents)
        )
        documents = [documents] if single else list(documents)
        batch_size = self._batch_size if batch_size is None else batch_size
        if batch_size is None:
            results = super().__call__(documents, num_workers=num_workers, **kwargs)
        else:  # the settings given when the pipeline was built, then this call's
            results = self._translate_batched(documents, batch_size,
                                              **{**self._forward_params, **self._sanitize_parameters(**kwargs)[1]})
        return results[0] if single else results

    def _translate_batched(self, documents, batch_size, window=4, streaming=False, **generate_kwargs):
        if streaming:
            raise ValueError("streaming translates one document at a time: batch_size applies to sliding windows")
        translations = translate_documents(self.model, self.tokenizer, documents, window=window,
                                           batch_size=batch_size, **generate_kwargs)
        return [{"translations": t} for t in translations]


PIPELINES = {
    "translation": TranslationPipeline,
    "summarization": SummarizationPipeline,
    "document-translation": DocumentTranslationPipeline,
}


def register_pipelines():
    """Make `pipeline("translation" | "summarization" | "document-translation", ...)` work in this process."""
    for task, cls in PIPELINES.items():
        REMOVED_TASKS.pop(task, None)
        PIPELINE_REGISTRY.supported_tasks.pop(task, None)  # re-registration is not an error
        PIPELINE_REGISTRY.register_pipeline(task, pipeline_class=cls, pt_model=AutoModelForSeq2SeqLM, type="text")


register_pipelines()
