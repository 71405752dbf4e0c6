"""TaLK checkpoints (TaLKConvolutions, a fairseq 0.10 extension: Lioutas & Guo, 2020) ->
TalkForConditionalGeneration.

Called by talk_hf/convert_fairseq.py (`convert_fairseq_checkpoint`), which reads the checkpoint. The layers are
fairseq LightConv's with the convolution replaced (docs/spec.md §A.5): per layer `linear1` (to conv_dim, or 2 *
conv_dim before a GLU), `conv.offsets` (Linear(conv_dim, 2H) in the encoder, (conv_dim, H) in the decoder: the
left offsets first), `linear2`, the Swish FFN `fc1`/`fc2`, the encoder's norms `layer_norms.0/1`, the decoder's
`conv_layer_norm`, `encoder_attn(_layer_norm)` and `final_layer_norm`; the decoder's unshared output matrix is
`decoder.embed_out`. The conv heads are the encoder's / decoder's attention heads, and the decoder's cross-attention
uses the decoder's heads too. A layer's max left (and, in the encoder, right) reach is its entry of
encoder_kernel_size_list / decoder_kernel_size_list.
"""

from .convert_fairseq import (
    FAIRSEQ_SPECIAL_IDS,
    DECODER_LAYER,
    ENCODER_LAYER,
    derived,
    layer_key,
    refuse,
    require,
    same,
    build_tokenizer,
    convert_state_dict,
    load_weights,
    model_args,
    moses_languages,
    read_dictionaries,
    rename_common,
    save_folder,
)

TALK_ARCHS = ("talkconv", "talkconv_iwslt_de_en", "talkconv_wmt_en_de_big", "talkconv_wmt_en_fr_big",
              "talkconv_cnndm_std", "talkconv_cnndm_deep")
REFUSED_ARCHS = {
    name: "it is a TaLK decoder-only language model (talkconv_lm); the converter reads translation models"
    for name in ("talkconv_lm", "talkconv_lm_big", "talkconv_lm_wiki103")
}
# the LightConv names without DynamicConv's kernel projection, plus TaLK's offsets projection
_CONV_LAYER = {"conv.offsets": "mixer.offsets"}
_TALK_ENCODER = {**{k: v for k, v in ENCODER_LAYER.items() if k != "conv.weight_linear"}, **_CONV_LAYER}
_TALK_DECODER = {**{k: v for k, v in DECODER_LAYER.items() if k != "conv.weight_linear"}, **_CONV_LAYER}


def check_supported(args):
    """Refuse (ValueError naming the option) what talk_hf's TaLK model cannot compute exactly -> d_model."""
    refuse(args, "encoder_learned_pos", lambda v: not v, "learned positions")
    refuse(args, "decoder_learned_pos", lambda v: not v, "learned positions")
    refuse(args, "no_token_positional_embeddings", lambda v: not v, "models without positions")
    refuse(args, "adaptive_softmax_cutoff", lambda v: v is None, "adaptive softmax")
    embed = same(args, "encoder_embed_dim", "decoder_embed_dim", "d_model")
    for name in ("decoder_input_dim", "decoder_output_dim"):
        refuse(args, name, lambda v: v == embed, f"a decoder projection to/from {name}")
    return embed


def max_offsets(args, side):
    """args.<side>_kernel_size_list: the first <side>_layers entries (TaLK reads entry i for layer i; a shorter list
    cannot build the model) -> list[int]."""
    sizes, layers = require(args, f"{side}_kernel_size_list", f"{side}_layers")
    if len(sizes) < layers:
        raise ValueError(f"{side}_kernel_size_list has {len(sizes)} entries for {layers} layers")
    return [int(k) for k in list(sizes)[:layers]]


def config_from_args(args, source_rows, target_rows):
    """TaLK model args -> TalkConfig (vocab sizes from the state dict's embeddings)."""
    from .configuration_talk import TalkConfig

    args = derived(args)
    d_model = check_supported(args)
    share_all = bool(args.get("share_all_embeddings"))
    numbers = require(args, "encoder_layers", "decoder_layers", "encoder_ffn_embed_dim", "decoder_ffn_embed_dim",
                       "encoder_attention_heads", "decoder_attention_heads", "encoder_glu", "decoder_glu")
    encoder_offsets = max_offsets(args, "encoder")
    return TalkConfig(
        vocab_size=target_rows, encoder_vocab_size=source_rows, tie_encoder_embeddings=share_all,
        tie_word_embeddings=share_all or bool(args.get("share_decoder_input_output_embed")),
        d_model=d_model, conv_dim=same(args, "encoder_conv_dim", "decoder_conv_dim", "conv_dim"),
        encoder_layers=numbers[0], decoder_layers=numbers[1], encoder_ffn_dim=numbers[2], decoder_ffn_dim=numbers[3],
        encoder_heads=numbers[4], decoder_heads=numbers[5], decoder_attention_heads=numbers[5],
        encoder_max_offsets=encoder_offsets, encoder_max_right_offsets=encoder_offsets,
        decoder_max_offsets=max_offsets(args, "decoder"),
        encoder_glu=bool(numbers[6]), decoder_glu=bool(numbers[7]),
        encoder_normalize_before=bool(args.get("encoder_normalize_before")),
        decoder_normalize_before=bool(args.get("decoder_normalize_before")),
        activation_function="swish",
        dropout=float(args.get("dropout") or 0.0), attention_dropout=float(args.get("attention_dropout") or 0.0),
        activation_dropout=float(args.get("relu_dropout") or 0.0),
        input_dropout=float(args.get("input_dropout") or 0.0),
        offset_dropout=float(args.get("weight_dropout") or 0.0),
        scale_embedding=True,
        position_offset=FAIRSEQ_SPECIAL_IDS["pad_token_id"] + 1,
        decoder_start_token_id=FAIRSEQ_SPECIAL_IDS["eos_token_id"],
        **{k: v for k, v in FAIRSEQ_SPECIAL_IDS.items() if k != "unk_token_id"},
    )


def rename(key, value):
    """A TaLK parameter name and tensor -> [(talk_hf name, tensor)] ([] for a buffer fairseq keeps), None for a name
    with no counterpart."""
    layer = layer_key(key)
    if layer is None:
        return rename_common(key, value)
    side, i, module, kind = layer
    table = _TALK_ENCODER if side == "encoder" else _TALK_DECODER
    return [(f"model.{side}.layers.{i}.{table[module]}.{kind}", value)] if module in table else None


def convert_talk(state, src_dir, out_dir, arch):
    """A TaLK checkpoint (already loaded) -> a save_pretrained folder at out_dir."""
    from .modeling_talk import TalkForConditionalGeneration

    args, weights = model_args(state), state["model"]
    source_dict, target_dict, source_rows, target_rows = read_dictionaries(src_dir, args, weights)
    config = config_from_args(args, source_rows, target_rows)
    model = TalkForConditionalGeneration(config)
    load_weights(model, convert_state_dict(weights, config, rename))
    tokenizer = build_tokenizer(src_dir, moses_languages(state), source_dict, target_dict)
    details = [
        f"Vocabularies {config.encoder_vocab_size} (source) / {config.vocab_size} (target).",
        f"{config.encoder_layers} encoder and {config.decoder_layers} decoder layers, d_model {config.d_model}, "
        f"GLU encoder/decoder {config.encoder_glu}/{config.decoder_glu}, max offsets {config.encoder_max_offsets} / "
        f"{config.decoder_max_offsets}.",
    ]
    return save_folder(model, tokenizer, out_dir, state, src_dir, f"TaLK ({arch})",
                       "Lioutas & Guo, 2020, *Time-aware Large Kernel Convolutions*", details)
