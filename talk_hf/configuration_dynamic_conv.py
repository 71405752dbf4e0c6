"""Configurations of the LightConv / DynamicConv models (Wu et al., ICLR 2019)."""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from .configuration_common import (
    TalkHfConfigMixin,
    check_activation,
    check_divisible,
    check_positive,
    check_probability,
    check_source_embeddings,
    check_token_ids,
    name_causal_lm,
    per_layer,
)

KERNEL_SIZES = [3, 7, 15, 31]  # the paper's growing kernels; later layers repeat the last entry
CONV_TYPES = ("dynamic", "lightweight")


def _check_conv_type(config):
    if config.conv_type not in CONV_TYPES:
        raise ValueError(f"conv_type must be one of {CONV_TYPES}, got {config.conv_type!r}")


@strict(accept_kwargs=True)
class DynamicConvConfig(TalkHfConfigMixin, PreTrainedConfig):
    r"""LightConv/DynamicConv encoder-decoder (`DynamicConvModel`, `DynamicConvForConditionalGeneration`).

    Defaults are fairseq's `lightconv_iwslt_de_en` with the README's dropout 0.3 (7+6 layers, d_model 512, FFN 1024,
    4 heads, no GLU, ReLU FFN). Presets: `DynamicConvConfig.from_preset("iwslt-de-en" | "wmt-en-de-big" | "base")`.

    Args:
        conv_type (`str`): "dynamic" (kernels predicted per position) or "lightweight" (one kernel per head).
        encoder_kernel_sizes / decoder_kernel_sizes (`list[int]`): per-layer kernel width K (encoder padding K//2,
            decoder K-1). Default [3, 7, 15, 31, 31, ...].
        encoder_conv_heads / decoder_conv_heads (`int`): kernel heads (channels per head share a kernel).
        weight_softmax (`bool`): softmax-normalise kernels over their K taps.
        weight_dropout (`float`): DropConnect on the normalised kernels (per position and batch element).
        encoder_vocab_size (`int`, optional): rows of the encoder's token embedding when the source has its own
            vocabulary (None: `vocab_size`, the target vocabulary of the decoder and the output projection).
        tie_encoder_embeddings (`bool`): with `tie_word_embeddings`, the encoder's token embedding is the decoder's
            too (transformers ties nothing when `tie_word_embeddings` is False: then all three are separate).
            False with `tie_word_embeddings`: only the decoder's input and output embeddings are one matrix.
        position_offset (`int`): added to every token position (counted from 0 over real tokens) before its
            sinusoid is taken; fairseq's models count from padding_idx + 1, i.e. 2 (talk_hf/convert_fairseq.py).
    """

    model_type = "dynamic_conv"
    LAYER_LISTS = (("encoder_kernel_sizes", "encoder_layers"), ("decoder_kernel_sizes", "decoder_layers"))
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_hidden_layers": "decoder_layers",
        "num_attention_heads": "decoder_attention_heads",
    }
    PRESETS = {
        "iwslt-de-en": {},
        "base": dict(
            encoder_ffn_dim=2048, decoder_ffn_dim=2048, encoder_conv_heads=8, decoder_conv_heads=8,
            decoder_attention_heads=8, encoder_glu=True, decoder_glu=True, dropout=0.1, attention_dropout=0.0,
            weight_dropout=0.0, input_dropout=0.1,
        ),
        "wmt-en-de-big": dict(
            d_model=1024, encoder_ffn_dim=4096, decoder_ffn_dim=4096, encoder_conv_heads=16, decoder_conv_heads=16,
            decoder_attention_heads=16, encoder_glu=True, decoder_glu=True, dropout=0.3, attention_dropout=0.1,
            weight_dropout=0.1, input_dropout=0.1,
        ),
    }

    vocab_size: int = 10000
    d_model: int = 512
    encoder_layers: int = 7
    decoder_layers: int = 6
    encoder_ffn_dim: int = 1024
    decoder_ffn_dim: int = 1024
    encoder_conv_heads: int = 4
    decoder_conv_heads: int = 4
    decoder_attention_heads: int = 4
    encoder_kernel_sizes: list[int] | None = None
    decoder_kernel_sizes: list[int] | None = None
    conv_type: str = "dynamic"
    conv_dim: int | None = None
    weight_softmax: bool = True
    encoder_glu: bool = False
    decoder_glu: bool = False
    encoder_normalize_before: bool = False
    decoder_normalize_before: bool = False
    activation_function: str = "relu"
    dropout: float | int = 0.3
    attention_dropout: float | int = 0.1
    activation_dropout: float | int = 0.0
    input_dropout: float | int = 0.0
    weight_dropout: float | int = 0.1
    scale_embedding: bool = True
    use_cache: bool = True
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 2
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = True
    encoder_vocab_size: int | None = None
    tie_encoder_embeddings: bool = True
    position_offset: int = 0

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.conv_dim = self.d_model if self.conv_dim is None else self.conv_dim
        self.encoder_kernel_sizes = per_layer(self.encoder_kernel_sizes, self.encoder_layers, KERNEL_SIZES)
        self.decoder_kernel_sizes = per_layer(self.decoder_kernel_sizes, self.decoder_layers, KERNEL_SIZES)
        self.check_fields()

    def check_fields(self, token_ids=True):
        check_positive(self, "vocab_size", "d_model", "conv_dim", "encoder_layers", "decoder_layers", "encoder_ffn_dim",
                       "decoder_ffn_dim", "encoder_conv_heads", "decoder_conv_heads", "decoder_attention_heads")
        check_source_embeddings(self)
        self.check_layer_lists()
        if 0 in self.encoder_kernel_sizes + self.decoder_kernel_sizes:
            raise ValueError("kernel sizes must be >= 1")
        _check_conv_type(self)
        check_divisible("conv_dim", self.conv_dim, "encoder_conv_heads", self.encoder_conv_heads)
        check_divisible("conv_dim", self.conv_dim, "decoder_conv_heads", self.decoder_conv_heads)
        check_divisible("d_model", self.d_model, "decoder_attention_heads", self.decoder_attention_heads)
        check_probability(self, "dropout", "attention_dropout", "activation_dropout", "input_dropout", "weight_dropout")
        check_activation(self)
        if token_ids:
            check_token_ids(self, "pad_token_id", "bos_token_id", "decoder_start_token_id")


@strict(accept_kwargs=True)
class DynamicConvLMConfig(TalkHfConfigMixin, PreTrainedConfig):
    r"""LightConv/DynamicConv decoder-only language model (`DynamicConvLMModel`, `DynamicConvForCausalLM`).

    Pre-norm layers with a final LayerNorm by default. Presets: `DynamicConvLMConfig.from_preset("lm")`.
    Args as `DynamicConvConfig` (decoder_* fields); label_smoothing is applied inside the model's loss.
    """

    model_type = "dynamic_conv_lm"
    LAYER_LISTS = (("decoder_kernel_sizes", "decoder_layers"),)
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "decoder_layers"}
    PRESETS = {"lm": {}}

    vocab_size: int = 10000
    d_model: int = 512
    decoder_layers: int = 6
    decoder_ffn_dim: int = 2048
    decoder_conv_heads: int = 8
    decoder_kernel_sizes: list[int] | None = None
    conv_type: str = "dynamic"
    conv_dim: int | None = None
    weight_softmax: bool = True
    decoder_glu: bool = True
    decoder_normalize_before: bool = True
    final_layer_norm: bool = True
    activation_function: str = "relu"
    dropout: float | int = 0.1
    activation_dropout: float | int = 0.0
    input_dropout: float | int = 0.0
    weight_dropout: float | int = 0.1
    label_smoothing: float | int = 0.0
    scale_embedding: bool = True
    use_cache: bool = True
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.conv_dim = self.d_model if self.conv_dim is None else self.conv_dim
        self.decoder_kernel_sizes = per_layer(self.decoder_kernel_sizes, self.decoder_layers, KERNEL_SIZES)
        self.check_fields()

    def check_fields(self, token_ids=True):
        check_positive(self, "vocab_size", "d_model", "conv_dim", "decoder_layers", "decoder_ffn_dim",
                       "decoder_conv_heads")
        self.check_layer_lists()
        if 0 in self.decoder_kernel_sizes:
            raise ValueError("kernel sizes must be >= 1")
        _check_conv_type(self)
        check_divisible("conv_dim", self.conv_dim, "decoder_conv_heads", self.decoder_conv_heads)
        check_probability(self, "dropout", "activation_dropout", "input_dropout", "weight_dropout", "label_smoothing")
        check_activation(self)
        if token_ids:
            check_token_ids(self, "pad_token_id", "bos_token_id")


name_causal_lm(DynamicConvLMConfig.model_type, "DynamicConvForCausalLM")
