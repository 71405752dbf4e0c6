"""talk_hf: TaLK convolutions, LightConv/DynamicConv and RFA-doc for the HuggingFace ecosystem.

Importing the package registers every config and model with the Auto classes, (re-)registers the
"translation" and "summarization" pipeline tasks that transformers 5 removed, and registers "document-translation".
"""

__version__ = "0.1.0"

from . import versions  # noqa: E402,F401  (checks the installed transformers first)
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
)

from . import metrics, ops  # noqa: E402,F401
from .configuration_dynamic_conv import DynamicConvConfig, DynamicConvLMConfig  # noqa: E402
from .configuration_rfa_doc import RfaDocConfig  # noqa: E402
from .configuration_talk import TalkConfig, TalkLMConfig  # noqa: E402
from .modeling_dynamic_conv import (  # noqa: E402
    DynamicConvForCausalLM,
    DynamicConvForConditionalGeneration,
    DynamicConvLMModel,
    DynamicConvModel,
)
from .modeling_rfa_doc import RfaDocForConditionalGeneration, RfaDocModel  # noqa: E402
from .modeling_talk import TalkForCausalLM, TalkForConditionalGeneration, TalkLMModel, TalkModel  # noqa: E402
from .document_translation import (  # noqa: E402
    ContextShortenedWarning,
    translate_document,
    translate_document_streaming,
    translate_documents,
)
from .pipeline_translation import (  # noqa: E402
    DocumentTranslationPipeline,
    SummarizationPipeline,
    TranslationPipeline,
)
from .tokenization import train_joint_bpe  # noqa: E402
from .tokenization_fairseq import FairseqMosesBpeTokenizer  # noqa: E402

for _config, _model, _head in [
    (TalkConfig, TalkModel, TalkForConditionalGeneration),
    (DynamicConvConfig, DynamicConvModel, DynamicConvForConditionalGeneration),
    (RfaDocConfig, RfaDocModel, RfaDocForConditionalGeneration),
]:
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForSeq2SeqLM.register(_config, _head, exist_ok=True)
    # saved folders and Hub repos carry their code: loadable with trust_remote_code=True without talk_hf
    _config.register_for_auto_class()
    _model.register_for_auto_class("AutoModel")
    _head.register_for_auto_class("AutoModelForSeq2SeqLM")

# converted fairseq models (talk_hf/convert_fairseq.py) name this tokenizer in their tokenizer_config.json
AutoTokenizer.register(DynamicConvConfig, tokenizer_class=FairseqMosesBpeTokenizer, exist_ok=True)
FairseqMosesBpeTokenizer.register_for_auto_class("AutoTokenizer")

for _config, _model, _head in [
    (TalkLMConfig, TalkLMModel, TalkForCausalLM),
    (DynamicConvLMConfig, DynamicConvLMModel, DynamicConvForCausalLM),
]:
    AutoConfig.register(_config.model_type, _config, exist_ok=True)
    AutoModel.register(_config, _model, exist_ok=True)
    AutoModelForCausalLM.register(_config, _head, exist_ok=True)
    _config.register_for_auto_class()
    _model.register_for_auto_class("AutoModel")
    _head.register_for_auto_class("AutoModelForCausalLM")

__all__ = [
    "ContextShortenedWarning",
    "DocumentTranslationPipeline",
    "DynamicConvConfig",
    "DynamicConvForCausalLM",
    "DynamicConvForConditionalGeneration",
    "DynamicConvLMConfig",
    "DynamicConvLMModel",
    "DynamicConvModel",
    "FairseqMosesBpeTokenizer",
    "RfaDocConfig",
    "RfaDocForConditionalGeneration",
    "RfaDocModel",
    "SummarizationPipeline",
    "TalkConfig",
    "TalkForCausalLM",
    "TalkForConditionalGeneration",
    "TalkLMConfig",
    "TalkLMModel",
    "TalkModel",
    "TranslationPipeline",
    "metrics",
    "ops",
    "train_joint_bpe",
    "translate_document",
    "translate_document_streaming",
    "translate_documents",
]
