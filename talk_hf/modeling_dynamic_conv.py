"""LightConv / DynamicConv models (Wu et al., ICLR 2019): encoder-decoder and causal LM.

Porting notes (docs/spec.md §B):
- The conv sub-block is: input dropout -> linear1 (or to 2*conv_dim + GLU) -> zero padded positions -> kernels
  (DynamicConv: Linear(conv_dim, H*K, no bias) of the current position; LightConv: one (H, K) parameter) softmaxed
  over all K taps, then DropConnect -> convolution (encoder padding K//2, decoder K-1) -> linear2. The FFN is ReLU.
  The op takes the logits and does the softmax and DropConnect itself (`softmax=True`, `weight_dropout`; its mask is
  drawn from a seed inside the op: one mask per forward for a LightConv kernel, as fairseq's).
- Kernels are softmaxed over all K taps and then truncated at the sequence start (zeros), in training and in
  decoding alike (fairseq's unfold path normalised short prefixes differently, docs/spec.md §B.1).
- Decoding carries the last K-1 conv inputs per layer; any number of new tokens per call (fairseq #3908).
"""

import torch
import torch.nn.functional as F
from torch import nn

from .configuration_dynamic_conv import DynamicConvConfig, DynamicConvLMConfig
from .dynamic_conv import dynamic_conv, dynamic_conv_state_from_prefix, dynamic_conv_step
from .modeling_base import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    RecurrentCausalLM,
    RecurrentCausalLMModel,
    RecurrentSeq2SeqLM,
    RecurrentSeq2SeqModel,
    SoftmaxCrossAttention,
    zero_padding,
)


class DynamicConvMixer(nn.Module):
    """The LightConv/DynamicConv sub-block. x: (B, T, d_model) -> (B, T, d_model)."""

    def __init__(self, config, conv_dim, heads, kernel_size, causal, glu):
        super().__init__()
        self.heads, self.kernel_size, self.causal, self.glu = heads, kernel_size, causal, glu
        self.padding_left = kernel_size - 1 if causal else kernel_size // 2
        self.weight_softmax, self.weight_dropout = config.weight_softmax, config.weight_dropout
        self.input_dropout = config.input_dropout
        self.linear1 = nn.Linear(config.d_model, 2 * conv_dim if glu else conv_dim)
        if config.conv_type == "dynamic":
            self.weight_linear, self.weight = nn.Linear(conv_dim, heads * kernel_size, bias=False), None
        else:
            self.weight_linear, self.weight = None, nn.Parameter(torch.empty(heads, kernel_size))
        self.linear2 = nn.Linear(conv_dim, config.d_model)

    def init_parameters(self, config):
        """The LightConv kernel (H, K), xavier-uniform (its linears are initialised as every other Linear)."""
        if self.weight is not None:
            from transformers import initialization as init

            init.xavier_uniform_(self.weight)

    def kernels(self, x):
        """x: (B, T, conv_dim) -> (B, T, H, K) (DynamicConv) or (H, K) (LightConv) kernels: logits when
        weight_softmax (the op normalises them), else the taps themselves."""
        if self.weight_linear is not None:
            return self.weight_linear(x).view(*x.shape[:2], self.heads, self.kernel_size)
        return self.weight.to(x.dtype)

    def forward(self, x, attention_mask=None, cache=None, separators=None):
        x = self.linear1(F.dropout(x, p=self.input_dropout, training=self.training))
        x = zero_padding(F.glu(x, dim=-1) if self.glu else x, attention_mask)
        w = self.kernels(x)
        conv_args = dict(softmax=self.weight_softmax, weight_dropout=self.weight_dropout if self.training else 0.0)
        cache = cache if self.causal else None
        last_inputs = cache.conv_state() if cache is not None else None
        if last_inputs is None:
            y = dynamic_conv(x, w, self.padding_left, **conv_args)
            if cache is not None:
                cache.write_conv_state(dynamic_conv_state_from_prefix(x, self.kernel_size))
        else:
            y, last_inputs = dynamic_conv_step(x, w, last_inputs, **conv_args)
            cache.write_conv_state(last_inputs)
        return self.linear2(y)


def _encoder_layer(config, i):
    mixer = DynamicConvMixer(
        config, config.conv_dim, config.encoder_conv_heads, config.encoder_kernel_sizes[i], False, config.encoder_glu
    )
    ffn = FeedForward(config.d_model, config.encoder_ffn_dim, config.activation_function, config.activation_dropout)
    return EncoderLayer(config.d_model, mixer, ffn, config.encoder_normalize_before, config.dropout)


def _decoder_layer(config, i, cross_attention):
    mixer = DynamicConvMixer(
        config, config.conv_dim, config.decoder_conv_heads, config.decoder_kernel_sizes[i], True, config.decoder_glu
    )
    cross = None
    if cross_attention:
        cross = SoftmaxCrossAttention(config.d_model, config.decoder_attention_heads, config.attention_dropout)
    ffn = FeedForward(config.d_model, config.decoder_ffn_dim, config.activation_function, config.activation_dropout)
    return DecoderLayer(config.d_model, mixer, cross, ffn, config.decoder_normalize_before, config.dropout)


class DynamicConvModel(RecurrentSeq2SeqModel):
    """LightConv/DynamicConv encoder and decoder (causal kernels + softmax cross-attention)."""

    config: DynamicConvConfig

    def encoder_layer(self, config, i):
        return _encoder_layer(config, i)

    def decoder_layer(self, config, i):
        return _decoder_layer(config, i, cross_attention=True)


class DynamicConvForConditionalGeneration(RecurrentSeq2SeqLM):
    """LightConv/DynamicConv encoder-decoder with a (tied) output projection."""

    config: DynamicConvConfig
    base_model_class = DynamicConvModel


class DynamicConvLMModel(RecurrentCausalLMModel):
    """LightConv/DynamicConv decoder without cross-attention."""

    config: DynamicConvLMConfig

    def decoder_layer(self, config, i):
        return _decoder_layer(config, i, cross_attention=False)


class DynamicConvForCausalLM(RecurrentCausalLM):
    """LightConv/DynamicConv causal language model."""

    config: DynamicConvLMConfig
    base_model_class = DynamicConvLMModel
