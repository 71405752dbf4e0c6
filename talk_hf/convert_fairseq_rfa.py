"""RFA-doc checkpoints (rfa-doc-mt, a fairseq 0.10 extension: Wu et al., 2022) -> RfaDocForConditionalGeneration.

Called by talk_hf/convert_fairseq.py (`convert_fairseq_checkpoint`), which reads the checkpoint. What the
checkpoint holds and where it goes (docs/converting.md, docs/spec.md §C):

- fairseq's softmax TransformerEncoder (`encoder.layers.N.self_attn.*`, ...) -> the talk_hf encoder layers.
- The cross-attention keys/values live in the encoder (`encoder.cross_attention_project.layers.N.{k,v}_proj`, with
  that layer's temperature `tau` (H, 1, 1)); its queries/output in the decoder layer
  (`decoder.layers.N.module.encoder_attn.module.{q,out}_proj`). Both sides -> `decoder.layers.N.cross_attention`.
- The decoder layers are wrapped twice (`decoder.layers.N.module.self_attn.module.*`): causal q/k/v/out projections,
  the decay gate `g_proj` (Linear(C, H)) and the temperature `tau` -> `decoder.layers.N.mixer`.
- The evaluation random matrices, one (H, D, d) tensor per side, the same for every layer:
  `decoder.random_matrices_eval` (causal) and `encoder.cross_attention_project.random_matrices_eval` (cross) ->
  every layer's `features.projection` buffer (persistent: saved in model.safetensors, loaded by from_pretrained
  instead of the seeded draw). The training pools (`decoder.random_matrices`,
  `encoder.cross_attention_project.random_matrices`) are not carried: a converted model that is trained again
  draws Gaussian projections (docs/spec.md §C.2).
- The separator `[@@SEP@@]` is the dictionary's extra special symbol of the doc_translation task: id 4, not written
  in the dict.*.txt files; the converted tokenizer lists it at id 4 as its sep_token.
"""

import re
import tempfile
from pathlib import Path

import torch

from .convert_fairseq import (
    FAIRSEQ_SPECIAL_IDS,
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

RFA_ARCHS = ("rfa_transformer_iwslt_de_en",)
REFUSED_ARCHS = {
    "doc_translation_transformer_iwslt_de_en": "it is rfa-doc-mt's softmax-attention baseline; talk_hf's RFA-doc "
                                               "decoder is random feature attention",
}
SEP_SYMBOL = "[@@SEP@@]"  # rfa-doc-mt's DocTranslationDictionary: an extra special symbol, id 4
SEP_ID = 4
# fairseq activation_fn -> transformers' ACT2FN name (gelu_accurate/gelu_fast: the tanh approximation)
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "gelu_accurate": "gelu_new", "gelu_fast": "gelu_new", "tanh": "tanh",
               "linear": "linear"}

ENCODER_LAYER = {
    "self_attn.q_proj": "mixer.q_proj", "self_attn.k_proj": "mixer.k_proj", "self_attn.v_proj": "mixer.v_proj",
    "self_attn.out_proj": "mixer.out_proj", "self_attn_layer_norm": "mixer_layer_norm", "fc1": "ffn.fc1",
    "fc2": "ffn.fc2", "final_layer_norm": "final_layer_norm",
}
DECODER_LAYER = {
    "self_attn.q_proj": "mixer.q_proj", "self_attn.k_proj": "mixer.k_proj", "self_attn.v_proj": "mixer.v_proj",
    "self_attn.out_proj": "mixer.out_proj", "self_attn.g_proj": "mixer.gate",
    "self_attn_layer_norm": "mixer_layer_norm",
    "encoder_attn.q_proj": "cross_attention.q_proj", "encoder_attn.out_proj": "cross_attention.out_proj",
    "encoder_attn_layer_norm": "cross_attention_layer_norm", "fc1": "ffn.fc1", "fc2": "ffn.fc2",
    "final_layer_norm": "final_layer_norm",
}
CAUSAL_EVAL, CROSS_EVAL = "decoder.random_matrices_eval", "encoder.cross_attention_project.random_matrices_eval"
_POOLS = re.compile(r"^(decoder|encoder\.cross_attention_project)\.random_matrices$")


# ---------------------------------------------------------------------------------------------------------------
# Config


def task_name(state):
    """The fairseq task the checkpoint was trained with (args.task or cfg["task"]["_name"])."""
    args = state.get("args")
    if args is not None and getattr(args, "task", None):
        return args.task
    task = (state.get("cfg") or {}).get("task") or {}
    return task.get("_name") if isinstance(task, dict) else getattr(task, "_name", None)


def check_supported(args):
    """Refuse (ValueError naming the option) what talk_hf's RFA-doc cannot compute exactly."""
    refuse(args, "use_sentential_gate", lambda v: not v,
            "the interpolating sentential gate; talk_hf implements the decay gate (--decay-sentential-gate)")
    refuse(args, "reparam_proj", lambda v: not v, "reparameterised random matrices (sigma * W)")
    refuse(args, "random_feature", lambda v: v == "rrf", "only the 'rrf' (sin/cos) random features are implemented")
    refuse(args, "encoder_learned_pos", lambda v: not v, "learned positions")
    refuse(args, "decoder_learned_pos", lambda v: not v, "learned positions")
    refuse(args, "no_token_positional_embeddings", lambda v: not v, "models without positions")
    refuse(args, "layernorm_embedding", lambda v: not v, "a LayerNorm after the embeddings")
    refuse(args, "no_cross_attention", lambda v: not v, "a decoder without cross-attention")
    refuse(args, "cross_self_attention", lambda v: not v, "cross+self attention")
    refuse(args, "adaptive_softmax_cutoff", lambda v: v is None, "adaptive softmax")
    refuse(args, "activation_fn", lambda v: v in ACTIVATIONS, f"activations other than {', '.join(ACTIVATIONS)}")
    for name in ("encoder_layers_to_keep", "decoder_layers_to_keep"):
        refuse(args, name, lambda v: not v, "fairseq keeps only the listed layers when it loads the checkpoint "
                                            "(LayerDrop pruning); the converter reads every layer")
    if args.get("decoder_normalize_before"):
        refuse(args, "no_decoder_final_norm", lambda v: not v, "a pre-norm decoder without its final LayerNorm")
    embed = same(args, "encoder_embed_dim", "decoder_embed_dim", "d_model (the cross-attention projects both)")
    for name in ("decoder_input_dim", "decoder_output_dim"):
        refuse(args, name, lambda v: v in (None, embed), f"a decoder projection to/from {name}")
    return embed


def gate_settings(args, has_sep):
    """(sentential_gate, gate_bias_init, sep_token_id) from --decay-sentential-gate / --decay-gate-bias and the task's
    separator."""
    if not args.get("decay_sentential_gate"):
        return "none", float(args.get("decay_gate_bias") or 0.0), SEP_ID if has_sep else None
    if not has_sep:
        raise ValueError("decay_sentential_gate=True needs the doc_translation task's separator [@@SEP@@] "
                         "(the checkpoint's task is not doc_translation)")
    return "decay", float(require(args, "decay_gate_bias")[0]), SEP_ID


def config_from_args(args, source_rows, target_rows, has_sep):
    """rfa-doc-mt model args -> RfaDocConfig (vocab sizes from the state dict's embeddings)."""
    from .configuration_rfa_doc import RfaDocConfig

    d_model = check_supported(args)
    share_all = bool(args.get("share_all_embeddings"))
    gate, gate_bias, sep = gate_settings(args, has_sep)
    layers = require(args, "encoder_layers", "decoder_layers", "encoder_ffn_embed_dim", "decoder_ffn_embed_dim",
                      "encoder_attention_heads", "decoder_attention_heads", "causal_proj_dim", "cross_proj_dim")
    return RfaDocConfig(
        vocab_size=target_rows, encoder_vocab_size=source_rows, tie_encoder_embeddings=share_all,
        tie_word_embeddings=share_all or bool(args.get("share_decoder_input_output_embed")),
        d_model=d_model, encoder_layers=layers[0], decoder_layers=layers[1], encoder_ffn_dim=layers[2],
        decoder_ffn_dim=layers[3], encoder_attention_heads=layers[4], decoder_attention_heads=layers[5],
        causal_num_frequencies=layers[6], cross_num_frequencies=layers[7],
        sentential_gate=gate, gate_bias_init=gate_bias, sep_token_id=sep,
        norm_rescale=bool(args.get("norm_rescale")), rfa_eps=0.1, rfa_init_scale=float(args.get("init_scale") or 1.0),
        encoder_normalize_before=bool(args.get("encoder_normalize_before")),
        decoder_normalize_before=bool(args.get("decoder_normalize_before")),
        activation_function=ACTIVATIONS[args.get("activation_fn") or "relu"],
        dropout=float(args.get("dropout") or 0.0), attention_dropout=float(args.get("attention_dropout") or 0.0),
        activation_dropout=float(args.get("activation_dropout") or args.get("relu_dropout") or 0.0),
        scale_embedding=not args.get("no_scale_embedding"),
        position_offset=FAIRSEQ_SPECIAL_IDS["pad_token_id"] + 1,
        decoder_start_token_id=FAIRSEQ_SPECIAL_IDS["eos_token_id"],
        **{k: v for k, v in FAIRSEQ_SPECIAL_IDS.items() if k != "unk_token_id"},
    )


# ---------------------------------------------------------------------------------------------------------------
# Weights


def _layer(key):
    """'decoder.layers.3.module.self_attn.module.q_proj.weight' -> ('decoder', 3, 'self_attn.q_proj', 'weight')
    (the DynamicWrapper's `.module` levels dropped); None outside the layers."""
    match = re.fullmatch(r"(encoder|decoder)\.layers\.(\d+)\.(.+)\.(weight|bias|tau)", key.replace(".module.", "."))
    return (match.group(1), int(match.group(2)), match.group(3), match.group(4)) if match else None


def _temperature(value):
    """A learned tau (H, 1, 1) -> (H,)."""
    return value.reshape(-1)


def _evaluation_matrices(key, value, config):
    """A side's (H, D, d) evaluation matrices -> the projection buffer of that side in every decoder layer."""
    side, frequencies = (("mixer", config.causal_num_frequencies) if key == CAUSAL_EVAL else
                         ("cross_attention", config.cross_num_frequencies))
    heads = config.decoder_attention_heads
    expected = (heads, frequencies, config.d_model // heads)
    if tuple(value.shape) != expected:
        raise ValueError(f"{key} has shape {tuple(value.shape)}, expected (heads, proj_dim, head_dim) = {expected}")
    return [(f"model.decoder.layers.{i}.{side}.features.projection", value) for i in range(config.decoder_layers)]


def rename(key, value, config):
    """An rfa-doc-mt parameter name and tensor -> [(talk_hf name, tensor)] ([] for what is not carried), None for a
    name with no counterpart."""
    if key in (CAUSAL_EVAL, CROSS_EVAL):
        return _evaluation_matrices(key, value, config)
    if _POOLS.match(key):
        return []
    cross = re.fullmatch(r"encoder\.cross_attention_project\.layers\.(\d+)\.(k_proj\.weight|k_proj\.bias|"
                         r"v_proj\.weight|v_proj\.bias|tau)", key)
    if cross:
        i, name = cross.groups()
        if name == "tau":
            return [(f"model.decoder.layers.{i}.cross_attention.features.tau", _temperature(value))]
        return [(f"model.decoder.layers.{i}.cross_attention.{name}", value)]
    layer = _layer(key)
    if layer is None:
        return rename_common(key, value)
    side, i, module, kind = layer
    if side == "decoder" and module == "self_attn" and kind == "tau":
        return [(f"model.decoder.layers.{i}.mixer.features.tau", _temperature(value))]
    table = ENCODER_LAYER if side == "encoder" else DECODER_LAYER
    return [(f"model.{side}.layers.{i}.{table[module]}.{kind}", value)] if module in table else None


def fixed_temperatures(args, config):
    """Without --learned-tau the checkpoint has no tau: every head's temperature is args.causal_tau / cross_tau."""
    if args.get("learned_tau"):
        return {}
    causal, cross = require(args, "causal_tau", "cross_tau")
    heads, fixed = config.decoder_attention_heads, {}
    for i in range(config.decoder_layers):
        fixed[f"model.decoder.layers.{i}.mixer.features.tau"] = torch.full((heads,), float(causal))
        fixed[f"model.decoder.layers.{i}.cross_attention.features.tau"] = torch.full((heads,), float(cross))
    return fixed


def check_gate_weights(weights, config):
    """The checkpoint has the gate's g_proj exactly when its args ask for the decay gate."""
    has_gate = any(".self_attn.module.g_proj." in key for key in weights)
    if config.sentential_gate == "decay" and not has_gate:
        raise ValueError("decay_sentential_gate=True but the checkpoint has no g_proj (the gate's weights)")
    if config.sentential_gate == "none" and has_gate:
        raise ValueError("the checkpoint has g_proj (a sentential gate's weights) but decay_sentential_gate is off: "
                         "its args do not say how the gate is applied")


def convert_weights(weights, config, args):
    """rfa-doc-mt state dict -> talk_hf state dict (float32); both evaluation matrices are required."""
    missing = [key for key in (CAUSAL_EVAL, CROSS_EVAL) if key not in weights]
    if missing:
        raise ValueError(f"the checkpoint has no {', '.join(missing)}: its evaluation random matrices are unknown")
    check_gate_weights(weights, config)
    converted = convert_state_dict(weights, config, lambda key, value: rename(key, value, config))
    converted.update(fixed_temperatures(args, config))
    return converted


# ---------------------------------------------------------------------------------------------------------------
# Entry point


def dictionary_with_separator(path, folder):
    """A copy of the fairseq dictionary `path` in `folder` whose first entry is [@@SEP@@], so that the tokenizer
    gives it id 4 as rfa-doc-mt's dictionary does -> the copy's path."""
    text = Path(path).read_text(encoding="utf-8")
    if any(line.split(" ")[0] == SEP_SYMBOL for line in text.splitlines()):
        raise ValueError(f"{path} lists {SEP_SYMBOL}, which rfa-doc-mt adds itself (id 4): not a doc_translation "
                         "dictionary file")
    copy = Path(folder) / Path(path).name
    copy.write_text(f"{SEP_SYMBOL} 0\n{text}", encoding="utf-8")
    return copy


def convert_rfa_doc(state, src_dir, out_dir, arch):
    """An RFA-doc checkpoint (already loaded) -> a save_pretrained folder at out_dir."""
    from .modeling_rfa_doc import RfaDocForConditionalGeneration

    args, weights = model_args(state), state["model"]
    has_sep = task_name(state) == "doc_translation"
    extra = (SEP_SYMBOL,) if has_sep else ()
    source_dict, target_dict, source_rows, target_rows = read_dictionaries(src_dir, args, weights, extra)
    config = config_from_args(args, source_rows, target_rows, has_sep)
    model = RfaDocForConditionalGeneration(config)
    load_weights(model, convert_weights(weights, config, args))
    with tempfile.TemporaryDirectory() as tmp:
        special = {}
        if has_sep:
            (Path(tmp) / "source").mkdir()
            (Path(tmp) / "target").mkdir()
            source_dict = dictionary_with_separator(source_dict, Path(tmp) / "source")
            target_dict = dictionary_with_separator(target_dict, Path(tmp) / "target")
            special = {"sep_token": SEP_SYMBOL}
        tokenizer = build_tokenizer(src_dir, moses_languages(state), source_dict, target_dict, **special)
        details = [
            f"Vocabularies {config.encoder_vocab_size} (source) / {config.vocab_size} (target)"
            + (f", separator {SEP_SYMBOL} = id {SEP_ID}." if has_sep else "."),
            f"{config.encoder_layers} encoder and {config.decoder_layers} decoder layers, d_model {config.d_model}, "
            f"random features causal D={config.causal_num_frequencies} / cross D={config.cross_num_frequencies} "
            f"(the checkpoint's evaluation matrices), sentential gate: {config.sentential_gate}.",
        ]
        return save_folder(model, tokenizer, out_dir, state, src_dir, f"RFA-doc ({arch})", "Wu et al., 2022, "
                           "*Modeling Context With Linear Attention for Scalable Document-Level Translation*", details)
