"""The config classes: the types their fields take, and the checks `save_pretrained` runs."""

import json
import typing
from dataclasses import fields

import pytest
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import AutoConfig

from tests.models.tiny import ALL

NAMES = ["talk", "talk_lm", "dynamic_conv", "dynamic_conv_lm", "rfa_doc"]  # one per config class
INTS = {"gate_bias_init": 2, "rfa_eps": 1, "rfa_init_scale": 6}  # an int each float field accepts (others: 0)
FLOAT_FIELDS = [(name, field.name) for name in NAMES for field in fields(ALL[name][0])
                if float in (field.type, *typing.get_args(field.type))]


@pytest.mark.parametrize("name,field", FLOAT_FIELDS)
def test_a_float_field_takes_an_int(name, field):
    """As transformers' own configs (BartConfig(dropout=0)): an int is kept as given, or assigned."""
    config_class, _, _, kwargs = ALL[name]
    value = INTS.get(field, 0)
    assert getattr(config_class(**{**kwargs, field: value}), field) == value
    config = config_class(**kwargs)
    setattr(config, field, value)
    assert getattr(config, field) == value


@pytest.mark.parametrize("name", NAMES)
def test_a_saved_config_with_an_int_for_a_float_field_loads(name, tmp_path):
    config_class, _, _, kwargs = ALL[name]
    config_class(**kwargs).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    path.write_text(json.dumps({**saved, "dropout": 0}))
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is config_class and loaded.dropout == 0
    assert config_class.from_pretrained(tmp_path, activation_dropout=0).activation_dropout == 0


CHANGED_CONFIGS = [
    ("talk", dict(d_model=15), "d_model=15 must be divisible by decoder_attention_heads=2"),
    ("talk", dict(dropout=1.5), "dropout must be a probability"),
    ("talk", dict(activation_function="nope"), "activation_function='nope' is not a known activation"),
    ("talk", dict(encoder_layers=3), "encoder_max_offsets has 2 entries"),
    ("talk", dict(decoder_max_offsets=[1, -2]), "decoder_max_offsets entries must be non-negative"),
    ("talk", dict(encoder_vocab_size=30), "encoder_vocab_size=30 differs from vocab_size=60"),
    ("talk_lm", dict(label_smoothing=1.0), "label_smoothing must be a probability"),
    ("talk_lm", dict(decoder_heads=3), "conv_dim=16 must be divisible by decoder_heads=3"),
    ("dynamic_conv", dict(conv_type="deformable"), "conv_type must be one of"),
    ("dynamic_conv", dict(pad_token_id=60), "pad_token_id=60 is outside the vocabulary"),
    ("dynamic_conv_lm", dict(decoder_kernel_sizes=[3, 0]), "kernel sizes must be >= 1"),
    ("dynamic_conv_lm", dict(vocab_size=0), "vocab_size must be a positive int"),
    ("rfa_doc", dict(sep_token_id=None), "sentential_gate needs sep_token_id"),
    ("rfa_doc", dict(rfa_eps=0.0), "rfa_eps and rfa_init_scale must be > 0"),
    ("rfa_doc", dict(position_offset=-1), "position_offset must be >= 0"),
]


@pytest.mark.parametrize("name,change,match", CHANGED_CONFIGS)
def test_save_refuses_a_config_changed_into_a_wrong_one(name, change, match, tmp_path):
    """The checks of a new config run again in `validate()`, which `save_pretrained` calls before it writes
    config.json (as LlamaConfig's head check): the ValueError naming the field is the strict error's cause."""
    config_class, _, _, kwargs = ALL[name]
    config = config_class(**kwargs)
    config.update(change)
    with pytest.raises(StrictDataclassClassValidationError, match=match) as error:
        config.save_pretrained(tmp_path)
    assert isinstance(error.value.__cause__, ValueError)
    assert not (tmp_path / "config.json").exists()
