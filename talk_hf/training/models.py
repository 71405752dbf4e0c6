"""Model construction for the training scripts: any talk_hf class from a preset or a config file, and the
transformers baselines (Marian/BART encoder-decoders, GPT-2) at a matching size."""

import dataclasses
import json
from pathlib import Path

from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    GPT2Config,
    GPT2LMHeadModel,
    MarianConfig,
    MarianMTModel,
)

from .. import (
    DynamicConvConfig,
    DynamicConvForCausalLM,
    DynamicConvForConditionalGeneration,
    DynamicConvLMConfig,
    RfaDocConfig,
    RfaDocForConditionalGeneration,
    TalkConfig,
    TalkForCausalLM,
    TalkForConditionalGeneration,
    TalkLMConfig,
)
from ..tokenization import document_separator, token_id

# kind -> (config class, model class, fixed config values)
TALK_HF_MODELS = {
    "talk": (TalkConfig, TalkForConditionalGeneration, {}),
    "dynamic_conv": (DynamicConvConfig, DynamicConvForConditionalGeneration, {"conv_type": "dynamic"}),
    "lightconv": (DynamicConvConfig, DynamicConvForConditionalGeneration, {"conv_type": "lightweight"}),
    "rfa_doc": (RfaDocConfig, RfaDocForConditionalGeneration, {}),
    "talk_lm": (TalkLMConfig, TalkForCausalLM, {}),
    "dynamic_conv_lm": (DynamicConvLMConfig, DynamicConvForCausalLM, {"conv_type": "dynamic"}),
    "lightconv_lm": (DynamicConvLMConfig, DynamicConvForCausalLM, {"conv_type": "lightweight"}),
}
BASELINES = ("marian", "bart", "gpt2")
KINDS = tuple(TALK_HF_MODELS) + BASELINES
CAUSAL_LM_KINDS = ("talk_lm", "dynamic_conv_lm", "lightconv_lm", "gpt2")
# the talk_hf field names each baseline reads (`_baseline`); it takes no others
GPT2_FIELDS = ("d_model", "decoder_layers", "decoder_attention_heads", "decoder_ffn_dim", "max_position_embeddings",
               "dropout", "attention_dropout")
ENCODER_DECODER_BASELINE_FIELDS = (
    "d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim", "decoder_ffn_dim", "encoder_attention_heads",
    "decoder_attention_heads", "dropout", "attention_dropout", "activation_dropout", "max_position_embeddings",
)


def token_ids(tokenizer):
    """The special ids every model is built with (joint BPE: bos 0, pad 1, eos 2; decoding starts with </s>)."""
    return dict(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def parse_overrides(items):
    """["d_model=256", "encoder_max_offsets=[1,3,7]", "dropout=0.1"] -> dict of JSON-decoded values (a field given
    twice is a ValueError)."""
    overrides = {}
    for item in items or ():
        if "=" not in item:
            raise ValueError(f"config override {item!r} must look like field=value")
        key, value = item.split("=", 1)
        if key in overrides:
            raise ValueError(f"config override {key!r} is given twice")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def build_model(kind, tokenizer, preset=None, config_file=None, overrides=None):
    """A freshly initialised model of `kind` for `tokenizer`'s vocabulary.

    talk_hf kinds take a preset name (see each config's PRESETS) and/or a JSON config file; baselines take
    `overrides` with the talk_hf field names they share (d_model, encoder_layers, decoder_layers,
    encoder_ffn_dim, decoder_ffn_dim, decoder_attention_heads, dropout, ...: see `config_fields`) and no preset. A
    key of the config file or of `overrides` that the kind does not take is a ValueError, and so is one that the kind
    or the tokenizer sets (vocab_size, the special token ids, conv_type) given another value, and a preset the kind
    does not have (`check_preset`).
    """
    ids = token_ids(tokenizer)
    if kind != "rfa_doc":
        return build_model_for_ids(kind, ids, preset, config_file, overrides)
    separator = token_id(tokenizer, document_separator(tokenizer))
    if separator is not None:  # the token that joins a window's sentences (prepare.py, document_translation.py)
        ids["sep_token_id"] = separator
    model = build_model_for_ids(kind, ids, preset, config_file, overrides)
    if separator is None and model.config.sentential_gate != "none":
        default = model.config.sep_token_id
        raise ValueError(
            f"the tokenizer has no sentence separator ({document_separator(tokenizer)!r}) for RFA-doc's sentential "
            f"gate, which would fire at id {default} ({tokenizer.convert_ids_to_tokens(default)!r}): add one "
            "(tokenizer.add_special_tokens({'sep_token': '<sep>'})) or set sentential_gate=\"none\""
        )
    return model


def build_model_for_ids(kind, ids, preset=None, config_file=None, overrides=None):
    """`build_model` without a tokenizer: `ids` holds vocab_size and the pad/bos/eos token ids (see `token_ids`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}; choose one of {KINDS}")
    check_preset(kind, preset)
    values = read_config_file(config_file, kind) if config_file else {}
    values.update(overrides or {})
    fixed = {**(TALK_HF_MODELS[kind][2] if kind in TALK_HF_MODELS else {}), **ids}
    _check_fields(kind, values, fixed)
    if kind in BASELINES:
        return _baseline(kind, ids, values)
    config_class, model_class, _ = TALK_HF_MODELS[kind]
    values.update(fixed)
    if kind not in CAUSAL_LM_KINDS:
        values.setdefault("decoder_start_token_id", ids["eos_token_id"])
    config = config_class.from_preset(preset, **values) if preset else config_class(**values)
    return model_class(config)


def check_preset(kind, preset):
    """ValueError unless `preset` is None or one of the presets of model kind `kind` (its config class's PRESETS;
    the transformers baselines have none: they are sized by overrides)."""
    if preset is None:
        return
    if kind in BASELINES:
        raise ValueError(f"model kind {kind!r} takes no preset (got {preset!r}): presets name talk_hf configurations; "
                         f"size a baseline with config fields (--set d_model=... encoder_layers=...)")
    presets = sorted(TALK_HF_MODELS[kind][0].PRESETS)
    if preset not in presets:
        raise ValueError(f"unknown preset {preset!r} for model kind {kind!r}; choose one of {presets}")


def read_config_file(path, kind):
    """A JSON config file's values. A saved config.json's keys that are not config fields go: `auto_map`, and
    `model_type`, which must be the kind's."""
    values = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    values.pop("auto_map", None)
    model_type = values.pop("model_type", None)
    expected = TALK_HF_MODELS[kind][0].model_type if kind in TALK_HF_MODELS else None
    if model_type is not None and model_type != expected:
        raise ValueError(f"{path} is a {model_type!r} config, not one of model kind {kind!r}")
    return values


def config_fields(kind):
    """The config keys `build_model` takes for `kind`: a talk_hf config's fields (its `__init__` parameters; those
    the class declares first, then those of PreTrainedConfig) less those the kind and the tokenizer set, or the
    talk_hf field names a baseline maps onto its own config."""
    if kind == "gpt2":
        return GPT2_FIELDS
    if kind in BASELINES:
        return ENCODER_DECODER_BASELINE_FIELDS
    config_class, _, fixed = TALK_HF_MODELS[kind]
    skip = {*fixed, "vocab_size", "pad_token_id", "bos_token_id", "eos_token_id"}
    names = [field.name for field in dataclasses.fields(config_class) if field.name not in skip]
    return tuple(sorted(names, key=lambda name: name not in config_class.__annotations__))


def _check_fields(kind, values, fixed):
    """ValueError naming the keys of `values` that `kind` does not take, or that it sets itself (`fixed`: the
    kind's fixed values and the tokenizer's ids) to another value."""
    valid = config_fields(kind)
    unknown = [key for key in values if key not in valid and key not in fixed]
    if unknown:
        raise ValueError(f"unknown config field(s) {unknown} for model kind {kind!r} (from the config file or the "
                         f"overrides); it takes: {', '.join(valid)}")
    clashing = [f"{key}={values[key]!r}" for key in values if key in fixed and values[key] != fixed[key]]
    if clashing:
        set_by = ", ".join(f"{key}={value!r}" for key, value in fixed.items())
        raise ValueError(f"config field(s) {', '.join(clashing)} clash with the values model kind {kind!r} and the "
                         f"tokenizer set ({set_by})")


def _baseline(kind, ids, values):
    d_model = values.get("d_model", 512)
    if kind == "gpt2":
        config = GPT2Config(
            vocab_size=ids["vocab_size"], n_embd=d_model, n_layer=values.get("decoder_layers", 6),
            n_head=values.get("decoder_attention_heads", 8), n_inner=values.get("decoder_ffn_dim", 4 * d_model),
            n_positions=values.get("max_position_embeddings", 1024), resid_pdrop=values.get("dropout", 0.1),
            embd_pdrop=values.get("dropout", 0.1), attn_pdrop=values.get("attention_dropout", 0.1),
            bos_token_id=ids["bos_token_id"], eos_token_id=ids["eos_token_id"], pad_token_id=ids["pad_token_id"],
        )
        return GPT2LMHeadModel(config)
    shared = dict(
        d_model=d_model, encoder_layers=values.get("encoder_layers", 6), decoder_layers=values.get("decoder_layers", 6),
        encoder_ffn_dim=values.get("encoder_ffn_dim", 1024), decoder_ffn_dim=values.get("decoder_ffn_dim", 1024),
        encoder_attention_heads=values.get("encoder_attention_heads", values.get("decoder_attention_heads", 4)),
        decoder_attention_heads=values.get("decoder_attention_heads", 4), dropout=values.get("dropout", 0.3),
        attention_dropout=values.get("attention_dropout", 0.1),
        activation_dropout=values.get("activation_dropout", 0.0),
        max_position_embeddings=values.get("max_position_embeddings", 1024), scale_embedding=True,
        decoder_start_token_id=ids["eos_token_id"], forced_eos_token_id=None, **ids,
    )
    if kind == "marian":
        return MarianMTModel(MarianConfig(**shared, activation_function="relu", share_encoder_decoder_embeddings=True))
    return BartForConditionalGeneration(BartConfig(**shared, activation_function="gelu"))


def count_parameters(model):
    """Trainable parameters, tied weights counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)  # parameters() yields a tied one once
