"""`pipeline("translation")` and `pipeline("summarization")` for the talk_hf encoder-decoders, and
`pipeline("document-translation")` for any encoder-decoder trained on sentence windows (document_translation.py).

transformers 5 removed the first two tasks; importing this module registers them again, and the third. Every talk_hf
config module imports it, so the tasks exist as soon as a talk_hf config is loaded, from the package or as Hub
remote code (`pipeline("translation", model=repo, trust_remote_code=True)` without the talk_hf package).
"""

from transformers import AutoModelForSeq2SeqLM, Pipeline
from transformers.pipelines import PIPELINE_REGISTRY, REMOVED_TASKS

from .document_translation import (
    document_sentences,
    translate_document,
    translate_document_streaming,
    translate_documents,
)


class TranslationPipeline(Pipeline):
    """Text(s) in, [{"translation_text": ...}] out; generation kwargs (num_beams, max_new_tokens, max_length,
    length_penalty, num_return_sequences, ...) pass through to `model.generate`; truncation (default True) cuts a
    source at the tokenizer's model_max_length."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True
    output_key = "translation_text"

    def _sanitize_parameters(self, truncation=None, **generate_kwargs):
        return ({} if truncation is None else {"truncation": truncation}), generate_kwargs, {}

    def preprocess(self, text, truncation=True):
        if not isinstance(text, str):
            raise TypeError(f"{type(self).__name__} takes a string or a list of strings, got {type(text).__name__}")
        return self.tokenizer(text, return_tensors="pt", truncation=truncation)

    def _forward(self, model_inputs, **generate_kwargs):
        """-> {"output_ids": (inputs, sequences per input, T)}: the pipeline's batches split along the first axis,
        so each input keeps its own num_return_sequences rows."""
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)
        inputs = model_inputs["input_ids"].shape[0]
        return {"output_ids": output_ids.reshape(inputs, output_ids.shape[0] // inputs, *output_ids.shape[1:])}

    def postprocess(self, model_outputs):
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"][0], skip_special_tokens=True)
        return [{self.output_key: text.strip()} for text in texts]

    def __call__(self, inputs, **kwargs):
        """A string -> [{"translation_text": ...}]; a list of strings -> one dict per input (a list of dicts per
        input when num_return_sequences > 1)."""
        result = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(r) == 1 for r in result):
            return [r[0] for r in result]
        return result


class SummarizationPipeline(TranslationPipeline):
    """As TranslationPipeline, with outputs under "summary_text"."""

    output_key = "summary_text"


class DocumentTranslationPipeline(Pipeline):
    """A document in, one translation per sentence out: {"translations": [...]}. A document is a list of sentences
    or a string with one sentence per line; a list of documents gives one dict per document (a list of str is one
    document's sentences, unless one of them holds a line break: then each is a document).

    window (default 4): sentences per window, the current one included; streaming=True carries the decoder state
    across sentences (talk_hf models) instead of sliding windows; batch_size: sliding windows of several documents
    per `generate()` call (`talk_hf.translate_documents`; without it, one document at a time); other keyword
    arguments go to `model.generate` (num_beams, max_new_tokens per sentence, ...)."""

    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_tokenizer = True

    def _sanitize_parameters(self, window=None, streaming=None, **generate_kwargs):
        """Forward parameters, generation arguments among them, each its own key: the pipeline merges a call's over
        those given when it was built, key by key."""
        forward = dict(generate_kwargs)
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

    def __call__(self, documents, batch_size=None, **kwargs):
        """One document (a str, or a list of str) -> {"translations": [...]}; a list of documents -> a list."""
        single = isinstance(documents, str) or (
            isinstance(documents, (list, tuple)) and all(isinstance(s, str) for s in documents)
            and not any("\n" in s for s in documents)
        )
        documents = [documents] if single else list(documents)
        batch_size = self._batch_size if batch_size is None else batch_size
        if batch_size is None:
            results = super().__call__(documents, **kwargs)
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
