"""Tiny configurations of every talk_hf model, for fast tests (the transformers ModelTester idea)."""

import torch

from talk_hf import (
    DynamicConvConfig,
    DynamicConvForCausalLM,
    DynamicConvForConditionalGeneration,
    DynamicConvLMConfig,
    DynamicConvLMModel,
    DynamicConvModel,
    RfaDocConfig,
    RfaDocForConditionalGeneration,
    RfaDocModel,
    TalkConfig,
    TalkForCausalLM,
    TalkForConditionalGeneration,
    TalkLMConfig,
    TalkLMModel,
    TalkModel,
)
from talk_hf.versions import CACHE_NAME



def cache_of(outputs):
    """The decoding state a model returned, under the installed transformers' name for it."""
    return getattr(outputs, CACHE_NAME)


VOCAB = 60
SEP = 4
_SEQ2SEQ_COMMON = dict(vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=24,
                       decoder_ffn_dim=24, decoder_attention_heads=2, dropout=0.0, attention_dropout=0.0)
_LM_COMMON = dict(vocab_size=VOCAB, d_model=16, decoder_layers=2, decoder_ffn_dim=24, dropout=0.0)

# name -> (config class, base model class, head class, config kwargs)
SEQ2SEQ = {
    "talk": (TalkConfig, TalkModel, TalkForConditionalGeneration,
             dict(_SEQ2SEQ_COMMON, encoder_heads=2, decoder_heads=4, encoder_max_offsets=[1, 4],
                  encoder_max_right_offsets=[3, 0], decoder_max_offsets=[2, 5], offset_dropout=0.0)),
    "talk-glu-prenorm": (TalkConfig, TalkModel, TalkForConditionalGeneration,
                         dict(_SEQ2SEQ_COMMON, encoder_heads=2, decoder_heads=2, encoder_glu=True, decoder_glu=True,
                              encoder_normalize_before=True, decoder_normalize_before=True, offset_dropout=0.0)),
    "dynamic_conv": (DynamicConvConfig, DynamicConvModel, DynamicConvForConditionalGeneration,
                     dict(_SEQ2SEQ_COMMON, encoder_conv_heads=2, decoder_conv_heads=4, encoder_kernel_sizes=[3, 4],
                          decoder_kernel_sizes=[3, 7], weight_dropout=0.0)),
    "lightconv": (DynamicConvConfig, DynamicConvModel, DynamicConvForConditionalGeneration,
                  dict(_SEQ2SEQ_COMMON, conv_type="lightweight", encoder_conv_heads=2, decoder_conv_heads=2,
                       encoder_kernel_sizes=[3, 5], decoder_kernel_sizes=[2, 5], weight_dropout=0.0)),
    # rfa_init_scale 0.25: RFA weights large beside nn.Linear's biases at d_model 16, so that the outputs depend on
    # the decoder's state (at the default 6 a tiny model's beams keep their order without a reordered cache)
    "rfa_doc": (RfaDocConfig, RfaDocModel, RfaDocForConditionalGeneration,
                dict(_SEQ2SEQ_COMMON, encoder_attention_heads=2, causal_num_frequencies=8, cross_num_frequencies=8,
                     gate_bias_init=0.0, sep_token_id=SEP, rfa_init_scale=0.25)),
    "rfa_doc-nogate": (RfaDocConfig, RfaDocModel, RfaDocForConditionalGeneration,
                       dict(_SEQ2SEQ_COMMON, encoder_attention_heads=2, causal_num_frequencies=8,
                            cross_num_frequencies=8, sentential_gate="none", rfa_init_scale=0.25)),
}
LM = {
    "talk_lm": (TalkLMConfig, TalkLMModel, TalkForCausalLM,
                dict(_LM_COMMON, decoder_heads=2, decoder_max_offsets=[2, 6], offset_dropout=0.0)),
    "dynamic_conv_lm": (DynamicConvLMConfig, DynamicConvLMModel, DynamicConvForCausalLM,
                        dict(_LM_COMMON, decoder_conv_heads=2, decoder_kernel_sizes=[3, 5], weight_dropout=0.0)),
    "lightconv_lm": (DynamicConvLMConfig, DynamicConvLMModel, DynamicConvForCausalLM,
                     dict(_LM_COMMON, conv_type="lightweight", decoder_conv_heads=4, decoder_kernel_sizes=[4, 3],
                          weight_dropout=0.0)),
}
ALL = {**SEQ2SEQ, **LM}


def make(name, head=True, seed=0, **overrides):
    """A freshly initialised tiny model in eval mode."""
    config_class, base_class, head_class, kwargs = ALL[name]
    torch.manual_seed(seed)
    model = (head_class if head else base_class)(config_class(**{**kwargs, **overrides}))
    return model.eval()


def source_batch(batch=3, length=9, seed=1):
    """Token ids avoiding special ids, with a right-padded row (attention_mask 0)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[1, length - 3 :] = 0
    ids[1, length - 3 :] = 1
    return ids, mask


def target_batch(batch=3, length=7, seed=2, with_separators=True):
    """Decoder-side ids; a separator in the middle of every row exercises the RFA-doc gate."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (batch, length), generator=g)
    if with_separators:
        ids[:, length // 2] = SEP
    return ids
