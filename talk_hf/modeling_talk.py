"""TaLK convolution models (Lioutas & Guo, ICML 2020): encoder-decoder and causal LM.

Porting notes (docs/spec.md §A.5):
- The TaLK sub-block is: input dropout -> linear1 (or linear1 to 2*conv_dim + GLU) -> zero padded positions ->
  TaLK convolution with offsets sigmoid(Linear(conv_dim, 2H)) (decoder: H, left only) and offset dropout ->
  linear2. The offsets Linear keeps PyTorch's default init (windows start near half their reach); the other
  Linears are xavier-uniform with zero bias.
- Positions count real tokens only, so padding on either side of an encoder input or an LM prompt does not
  change any real token's output (fairseq relied on right padding in the decoder).
- Decoding carries the last max_left + 2 prefix sums per layer (fixed size) instead of the whole history.
"""

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_talk import TalkConfig, TalkLMConfig
from .modeling_base import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    RecurrentCausalLM,
    RecurrentCausalLMModel,
    RecurrentSeq2SeqLM,
    RecurrentSeq2SeqModel,
    SoftmaxCrossAttention,
    initialised_linear,
    torch_default_linear_,
    zero_padding,
)
from .talk_conv import talk_conv, talk_conv_state_from_prefix, talk_conv_step


class TalkConvMixer(nn.Module):
    """The TaLK sub-block: projections around a TaLK convolution whose windows are predicted per token and head.

    x: (B, T, d_model) -> (B, T, d_model). Causal mixers decode from a fixed-size prefix-sum state.
    """

    def __init__(self, d_model, conv_dim, heads, max_left, max_right, causal, glu, input_dropout, offset_dropout):
        super().__init__()
        self.heads, self.max_left, self.max_right, self.causal, self.glu = heads, max_left, max_right, causal, glu
        self.input_dropout, self.offset_dropout = input_dropout, offset_dropout
        self.linear1 = nn.Linear(d_model, 2 * conv_dim if glu else conv_dim)
        # the relative window offsets, initialised as nn.Linear initialises itself (docs/spec.md §A.5)
        self.offsets = initialised_linear(conv_dim, heads if causal else 2 * heads, torch_default_linear_)
        self.linear2 = nn.Linear(conv_dim, d_model)

    def forward(self, x, attention_mask=None, cache=None, separators=None):
        x = self.linear1(F.dropout(x, p=self.input_dropout, training=self.training))
        x = zero_padding(F.glu(x, dim=-1) if self.glu else x, attention_mask)
        offsets = F.dropout(torch.sigmoid(self.offsets(x)), p=self.offset_dropout, training=self.training)
        if not self.causal:
            y = talk_conv(x, offsets[..., : self.heads], offsets[..., self.heads :], self.max_left, self.max_right)
        else:
            y = self._causal(x, offsets, cache)
        return self.linear2(y)

    def _causal(self, x, offsets, cache):
        """Full causal op, or a continuation from the layer's prefix-sum ring (cache.conv_state()) when decoding."""
        prefix_sums = cache.conv_state() if cache is not None else None
        if prefix_sums is None:
            y = talk_conv(x, offsets, None, self.max_left, 0)
            if cache is not None:
                cache.write_conv_state(talk_conv_state_from_prefix(x, self.max_left))
            return y
        y, prefix_sums = talk_conv_step(x, offsets, prefix_sums, self.max_left)
        cache.write_conv_state(prefix_sums)
        return y


def _encoder_layer(config, i):
    mixer = TalkConvMixer(
        config.d_model, config.conv_dim, config.encoder_heads, config.encoder_max_offsets[i],
        config.encoder_max_right_offsets[i], False, config.encoder_glu, config.input_dropout, config.offset_dropout,
    )
    ffn = FeedForward(config.d_model, config.encoder_ffn_dim, config.activation_function, config.activation_dropout)
    return EncoderLayer(config.d_model, mixer, ffn, config.encoder_normalize_before, config.dropout)


def _decoder_layer(config, i, cross_attention):
    mixer = TalkConvMixer(
        config.d_model, config.conv_dim, config.decoder_heads, config.decoder_max_offsets[i], 0, True,
        config.decoder_glu, config.input_dropout, config.offset_dropout,
    )
    cross = None
    if cross_attention:
        cross = SoftmaxCrossAttention(config.d_model, config.decoder_attention_heads, config.attention_dropout)
    ffn = FeedForward(config.d_model, config.decoder_ffn_dim, config.activation_function, config.activation_dropout)
    return DecoderLayer(config.d_model, mixer, cross, ffn, config.decoder_normalize_before, config.dropout)


class TalkModel(RecurrentSeq2SeqModel):
    """TaLK encoder (non-causal windows) and decoder (causal windows + softmax cross-attention)."""

    config: TalkConfig

    def encoder_layer(self, config, i):
        return _encoder_layer(config, i)

    def decoder_layer(self, config, i):
        return _decoder_layer(config, i, cross_attention=True)


class TalkForConditionalGeneration(RecurrentSeq2SeqLM):
    """TaLK encoder-decoder with a (tied) output projection: translation, summarisation, `generate()`."""

    config: TalkConfig
    base_model_class = TalkModel


class TalkLMModel(RecurrentCausalLMModel):
    """TaLK decoder without cross-attention (pre-norm by default)."""

    config: TalkLMConfig

    def decoder_layer(self, config, i):
        return _decoder_layer(config, i, cross_attention=False)


class TalkForCausalLM(RecurrentCausalLM):
    """TaLK causal language model."""

    config: TalkLMConfig
    base_model_class = TalkLMModel
