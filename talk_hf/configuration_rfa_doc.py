"""Configuration of RFA-doc (Wu et al., 2022): a softmax-attention encoder and a random-feature-attention decoder
with a sentence-level decay gate, for sentence- and document-level translation."""

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from .configuration_common import (
    TalkHfConfigMixin,
    check_activation,
    check_divisible,
    check_finite,
    check_positive,
    check_probability,
    check_source_embeddings,
    check_token_ids,
)

GATES = ("none", "decay")


@strict(accept_kwargs=True)
class RfaDocConfig(TalkHfConfigMixin, PreTrainedConfig):
    r"""RFA-doc encoder-decoder (`RfaDocModel`, `RfaDocForConditionalGeneration`).

    Defaults follow the paper's IWSLT zh-en recipe (`train_rfa.sh`: 6+6 layers, d_model 512, 8 heads, FFN 1024, GELU,
    dropout 0.3, post-norm, causal D=32 and cross D=256 random frequencies, decay gate with bias 2 at `<sep>`).
    Presets: `RfaDocConfig.from_preset("iwslt-zh-en" | "iwslt-zh-en-nogate")`.

    Args:
        causal_num_frequencies / cross_num_frequencies (`int`): D of the random feature maps (features have 2D entries).
        sentential_gate (`str`): "decay" multiplies the decoder's attention state by a learned per-head gate
            sigmoid(w.x + b) after every `sep_token_id` (the paper's RFA-sgate); "none" disables it.
        gate_bias_init (`float`): initial gate bias (2.0: sigmoid ~ 0.88 keeps most context at first).
        sep_token_id (`int`): the sentence separator of document windows.
        norm_rescale (`bool`): rescale cross-attention key features by their norms (docs/spec.md §C.1).
        resample_random_features (`bool`): draw new Gaussian projections every training step (the evaluation
            projections are fixed, stored in the checkpoint, and shared by all layers, as in the reference).
        random_feature_seed (`int`): seed of the evaluation projections.
        rfa_eps (`float`): lower bound of the attention normaliser.
        rfa_init_scale (`float`): xavier gain rfa_init_scale**-0.5 for the RFA projections.
        encoder_vocab_size (`int`, optional): rows of the encoder's token embedding when the source has its own
            vocabulary (None: `vocab_size`). tie_encoder_embeddings (`bool`): with `tie_word_embeddings`, the
            encoder's token embedding is the decoder's too; False: only the decoder's input and output are tied.
        position_offset (`int`): added to every token position before its sinusoid is taken (fairseq's models
            count from padding_idx + 1 = 2; talk_hf/convert_fairseq.py). The defaults keep one shared vocabulary
            and positions from 0.
    """

    model_type = "rfa_doc"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_hidden_layers": "decoder_layers",
        "num_attention_heads": "decoder_attention_heads",
    }
    PRESETS = {"iwslt-zh-en": {}, "iwslt-zh-en-nogate": dict(sentential_gate="none")}

    vocab_size: int = 10000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_ffn_dim: int = 1024
    decoder_ffn_dim: int = 1024
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    causal_num_frequencies: int = 32
    cross_num_frequencies: int = 256
    sentential_gate: str = "decay"
    gate_bias_init: float | int = 2.0
    norm_rescale: bool = True
    resample_random_features: bool = True
    random_feature_seed: int = 31415
    rfa_eps: float | int = 0.1
    rfa_init_scale: float | int = 6.0
    encoder_normalize_before: bool = False
    decoder_normalize_before: bool = False
    activation_function: str = "gelu"
    dropout: float | int = 0.3
    attention_dropout: float | int = 0.1
    activation_dropout: float | int = 0.0
    scale_embedding: bool = True
    encoder_vocab_size: int | None = None
    tie_encoder_embeddings: bool = True
    position_offset: int = 0
    use_cache: bool = True
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 2
    sep_token_id: int | None = 4
    decoder_start_token_id: int | None = 2
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        super().__post_init__(**kwargs)
        self.check_fields()

    def check_fields(self, token_ids=True):
        check_positive(self, "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim",
                       "decoder_ffn_dim", "encoder_attention_heads", "decoder_attention_heads",
                       "causal_num_frequencies", "cross_num_frequencies")
        check_divisible("d_model", self.d_model, "encoder_attention_heads", self.encoder_attention_heads)
        check_divisible("d_model", self.d_model, "decoder_attention_heads", self.decoder_attention_heads)
        if self.sentential_gate not in GATES:
            raise ValueError(f"sentential_gate must be one of {GATES}, got {self.sentential_gate!r}")
        if self.sentential_gate != "none" and self.sep_token_id is None:
            raise ValueError("sentential_gate needs sep_token_id (the sentence separator)")
        check_finite(self, "gate_bias_init", "rfa_eps", "rfa_init_scale")
        if not self.rfa_eps > 0 or not self.rfa_init_scale > 0:
            raise ValueError(f"rfa_eps and rfa_init_scale must be > 0, got {self.rfa_eps}, {self.rfa_init_scale}")
        seed = self.random_feature_seed
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise ValueError(f"random_feature_seed must be an int in [0, 2**63) (a torch.Generator seed), got {seed!r}")
        check_probability(self, "dropout", "attention_dropout", "activation_dropout")
        check_activation(self)
        if token_ids:
            check_token_ids(self, "pad_token_id", "bos_token_id", "decoder_start_token_id", "sep_token_id")
        check_source_embeddings(self)
