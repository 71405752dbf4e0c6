"""Configurations of the TaLK convolution models (Lioutas & Guo, ICML 2020)."""

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

ENCODER_OFFSETS = [1, 3, 7, 15]  # the paper's growing max offsets; later layers repeat the last entry
ENCODER_OFFSETS_BIG = [3, 7, 15, 31]


@strict(accept_kwargs=True)
class TalkConfig(TalkHfConfigMixin, PreTrainedConfig):
    r"""TaLK encoder-decoder for translation and summarisation (`TalkModel`, `TalkForConditionalGeneration`).

    Defaults are the paper's IWSLT14 De-En model (`talkconv_iwslt_de_en`: 7+6 layers, d_model 512, FFN 1024, 4 heads,
    no GLU, dropout 0.3). Presets: `TalkConfig.from_preset("iwslt-de-en" | "wmt-en-de-big" | "base", **overrides)`.

    Args:
        encoder_max_offsets / decoder_max_offsets (`list[int]`): per-layer maximum left reach of the windows
            (the decoder's windows end at the current token). Default [1, 3, 7, 15, 15, ...].
        encoder_max_right_offsets (`list[int]`, optional): per-layer maximum right reach of the encoder windows
            (default: the same as encoder_max_offsets, as in the paper).
        encoder_heads / decoder_heads (`int`): TaLK offset heads (channels per head share their window).
        decoder_attention_heads (`int`): heads of the softmax cross-attention.
        conv_dim (`int`, optional): width of the TaLK sub-block (default d_model); encoder_glu/decoder_glu double
            the input projection and gate it.
        offset_dropout (`float`): dropout on the predicted relative offsets (windows may exceed max while training).
        input_dropout (`float`): dropout before the sub-block's input projection.
        activation_function (`str`): FFN activation ("swish" in the paper).
        encoder_vocab_size (`int`, optional): rows of the encoder's token embedding when the source has its own
            vocabulary (None: `vocab_size`). tie_encoder_embeddings (`bool`): with `tie_word_embeddings`, the
            encoder's token embedding is the decoder's too; False: only the decoder's input and output are tied.
        position_offset (`int`): added to every token position before its sinusoid is taken (fairseq's models
            count from padding_idx + 1 = 2; talk_hf/convert_fairseq.py). The defaults keep one shared vocabulary
            and positions from 0.
    """

    model_type = "talk"
    LAYER_LISTS = (("encoder_max_offsets", "encoder_layers"), ("encoder_max_right_offsets", "encoder_layers"),
                   ("decoder_max_offsets", "decoder_layers"))
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_hidden_layers": "decoder_layers",
        "num_attention_heads": "decoder_attention_heads",
    }
    PRESETS = {
        "iwslt-de-en": {},
        "base": dict(
            encoder_ffn_dim=2048, decoder_ffn_dim=2048, encoder_heads=8, decoder_heads=8, decoder_attention_heads=8,
            encoder_glu=True, decoder_glu=True, dropout=0.1, attention_dropout=0.0, offset_dropout=0.0,
            input_dropout=0.1,
        ),
        "wmt-en-de-big": dict(
            d_model=1024, encoder_ffn_dim=4096, decoder_ffn_dim=4096, encoder_heads=16, decoder_heads=16,
            decoder_attention_heads=16, encoder_glu=True, decoder_glu=True, dropout=0.3, attention_dropout=0.1,
            offset_dropout=0.1, input_dropout=0.1, encoder_max_offsets=[3, 7, 15, 31, 31, 31, 31],
            decoder_max_offsets=[3, 7, 15, 31, 31, 31],
        ),
    }

    vocab_size: int = 10000
    d_model: int = 512
    encoder_layers: int = 7
    decoder_layers: int = 6
    encoder_ffn_dim: int = 1024
    decoder_ffn_dim: int = 1024
    encoder_heads: int = 4
    decoder_heads: int = 4
    decoder_attention_heads: int = 4
    encoder_max_offsets: list[int] | None = None
    encoder_max_right_offsets: list[int] | None = None
    decoder_max_offsets: list[int] | None = None
    conv_dim: int | None = None
    encoder_glu: bool = False
    decoder_glu: bool = False
    encoder_normalize_before: bool = False
    decoder_normalize_before: bool = False
    activation_function: str = "swish"
    dropout: float | int = 0.3
    attention_dropout: float | int = 0.1
    activation_dropout: float | int = 0.0
    input_dropout: float | int = 0.0
    offset_dropout: float | int = 0.1
    scale_embedding: bool = True
    encoder_vocab_size: int | None = None
    tie_encoder_embeddings: bool = True
    position_offset: int = 0
    use_cache: bool = True
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 2
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = True

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """The mixin's from_dict; an override of encoder_max_offsets (`from_pretrained(path, encoder_max_offsets=...)`)
        moves a saved encoder_max_right_offsets that equals the saved left reach with it, as a new config derives
        the right reach from the left one."""
        follows = config_dict.get("encoder_max_right_offsets") == config_dict.get("encoder_max_offsets")
        if "encoder_max_offsets" in kwargs and "encoder_max_right_offsets" not in kwargs and follows:
            kwargs["encoder_max_right_offsets"] = None
        return super().from_dict(config_dict, **kwargs)

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.conv_dim = self.d_model if self.conv_dim is None else self.conv_dim
        self.encoder_max_offsets = per_layer(self.encoder_max_offsets, self.encoder_layers, ENCODER_OFFSETS)
        self.encoder_max_right_offsets = per_layer(self.encoder_max_right_offsets, self.encoder_layers,
                                                   self.encoder_max_offsets)
        self.decoder_max_offsets = per_layer(self.decoder_max_offsets, self.decoder_layers, ENCODER_OFFSETS)
        self.check_fields()

    def check_fields(self, token_ids=True):
        check_positive(self, "vocab_size", "d_model", "conv_dim", "encoder_layers", "decoder_layers", "encoder_ffn_dim",
                       "decoder_ffn_dim", "encoder_heads", "decoder_heads", "decoder_attention_heads")
        self.check_layer_lists()
        check_divisible("conv_dim", self.conv_dim, "encoder_heads", self.encoder_heads)
        check_divisible("conv_dim", self.conv_dim, "decoder_heads", self.decoder_heads)
        check_divisible("d_model", self.d_model, "decoder_attention_heads", self.decoder_attention_heads)
        check_probability(self, "dropout", "attention_dropout", "activation_dropout", "input_dropout", "offset_dropout")
        check_activation(self)
        if token_ids:
            check_token_ids(self, "pad_token_id", "bos_token_id", "decoder_start_token_id")
        check_source_embeddings(self)


@strict(accept_kwargs=True)
class TalkLMConfig(TalkHfConfigMixin, PreTrainedConfig):
    r"""TaLK decoder-only language model (`TalkLMModel`, `TalkForCausalLM`).

    As in the paper's LM: pre-norm layers ("training is not stable without this") and no final LayerNorm by default.
    Presets: `TalkLMConfig.from_preset("lm" | "lm-big")`.

    Args:
        decoder_max_offsets (`list[int]`): per-layer maximum left reach (default [1, 3, 7, 15, 15, ...]).
        decoder_heads (`int`): TaLK offset heads. label_smoothing (`float`): applied inside the model's loss
            (Trainer's `label_smoothing_factor` does the same from outside, the labels shifted as for any causal LM
            transformers lists; use one of the two).
    """

    model_type = "talk_lm"
    LAYER_LISTS = (("decoder_max_offsets", "decoder_layers"),)
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "decoder_layers"}
    PRESETS = {
        "lm": {},
        "lm-big": dict(d_model=1024, decoder_layers=12, decoder_ffn_dim=4096, decoder_heads=16, decoder_glu=True,
                       decoder_max_offsets=[3, 7, 15, 31] + [63] * 8, dropout=0.2),
    }

    vocab_size: int = 10000
    d_model: int = 512
    decoder_layers: int = 6
    decoder_ffn_dim: int = 2048
    decoder_heads: int = 8
    decoder_max_offsets: list[int] | None = None
    conv_dim: int | None = None
    decoder_glu: bool = True
    decoder_normalize_before: bool = True
    final_layer_norm: bool = False
    activation_function: str = "swish"
    dropout: float | int = 0.1
    activation_dropout: float | int = 0.0
    input_dropout: float | int = 0.0
    offset_dropout: float | int = 0.1
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
        self.decoder_max_offsets = per_layer(self.decoder_max_offsets, self.decoder_layers, ENCODER_OFFSETS)
        self.check_fields()

    def check_fields(self, token_ids=True):
        check_positive(self, "vocab_size", "d_model", "conv_dim", "decoder_layers", "decoder_ffn_dim", "decoder_heads")
        self.check_layer_lists()
        check_divisible("conv_dim", self.conv_dim, "decoder_heads", self.decoder_heads)
        check_probability(self, "dropout", "activation_dropout", "input_dropout", "offset_dropout", "label_smoothing")
        check_activation(self)
        if token_ids:
            check_token_ids(self, "pad_token_id", "bos_token_id")


name_causal_lm(TalkLMConfig.model_type, "TalkForCausalLM")
