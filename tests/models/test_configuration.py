"""The config classes: the types their fields take (the checks of their values: test_modeling_common.py's
BAD_CONFIGS)."""

import json
import typing
from dataclasses import fields

import pytest
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
