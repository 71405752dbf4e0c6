"""Validation helpers and named presets shared by the talk_hf configs. Every check raises ValueError naming the
config field, so a wrong value fails when the config is built or saved, not deep inside a forward pass."""

import math

from transformers.activations import ACT2FN
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from .pipeline_translation import register_pipelines  # noqa: F401  (importing it registers the tasks)
from .recurrent_cache import LAYER_TYPE as RECURRENT_LAYER_TYPE


def name_causal_lm(model_type, class_name):
    """List a causal LM class where transformers looks causal LMs up by class name (`register` does not fill that
    table): Trainer's label smoother shifts the labels of the models it lists, and the text-generation pipeline
    accepts them. Called by the LM config modules, so that Hub remote code without talk_hf lists them too."""
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(model_type, class_name)


def per_layer(value, num_layers, default):
    """A per-layer list: None -> `default` (the paper's pattern, truncated or extended with its last entry); a list
    -> a copy of it (TalkHfConfigMixin.check_layer_lists checks it)."""
    if value is None:
        value = list(default[: max(num_layers, 0)])
        value += default[-1:] * (num_layers - len(value))
    return list(value)


def check_positive(config, *names):
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")


def check_probability(config, *names):
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be a probability in [0, 1), got {value!r}")


def check_finite(config, *names):
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")


def check_divisible(name, value, heads_name, heads):
    if value % heads:
        raise ValueError(f"{name}={value} must be divisible by {heads_name}={heads}")


def check_activation(config, name="activation_function"):
    if getattr(config, name) not in ACT2FN:
        raise ValueError(f"{name}={getattr(config, name)!r} is not a known activation ({', '.join(sorted(ACT2FN))})")


def check_token_ids(config, *names):
    for name in names:
        value = getattr(config, name)
        if value is not None and not 0 <= value < config.vocab_size:
            raise ValueError(f"{name}={value} is outside the vocabulary (vocab_size={config.vocab_size})")


def check_source_embeddings(config):
    """The fields of a source vocabulary of its own (`encoder_vocab_size`, `tie_encoder_embeddings`) and of
    `position_offset`, as converted fairseq models set them (talk_hf/convert_fairseq.py)."""
    if config.encoder_vocab_size is not None:
        check_positive(config, "encoder_vocab_size")
        if config.pad_token_id is not None and not config.pad_token_id < config.encoder_vocab_size:
            raise ValueError(f"pad_token_id={config.pad_token_id} is outside the source vocabulary "
                             f"(encoder_vocab_size={config.encoder_vocab_size}), whose padding row it names")
    tied = config.tie_word_embeddings and config.tie_encoder_embeddings
    if tied and config.encoder_vocab_size not in (None, config.vocab_size):
        raise ValueError(
            f"encoder_vocab_size={config.encoder_vocab_size} differs from vocab_size={config.vocab_size}, so the "
            "encoder cannot share the decoder's embedding: set tie_encoder_embeddings=False"
        )
    if isinstance(config.position_offset, bool) or not isinstance(config.position_offset, int):
        raise ValueError(f"position_offset must be an int, got {config.position_offset!r}")
    if config.position_offset < 0:
        raise ValueError(f"position_offset must be >= 0, got {config.position_offset}")


class TalkHfConfigMixin:
    """Shared by the talk_hf configs: named presets, and the field checks (each class's `check_fields(token_ids=True)`:
    a ValueError naming the field; token_ids=False leaves out the special token ids' range) run when a config is
    built, again by `validate()`, which `save_pretrained` calls before it writes config.json, and by a model built
    from the config.

    Loading any talk_hf config, from the package or as Hub remote code, imports pipeline_translation, which
    registers the "translation" and "summarization" tasks; `pipeline()` loads the config before it looks the task
    up, so `pipeline("translation", model=repo, trust_remote_code=True)` works without the package."""

    PRESETS = {}
    LAYER_LISTS = ()  # (per-layer list field, the field counting its layers) pairs

    @classmethod
    def from_dict(cls, config_dict, **kwargs):
        """transformers' from_dict, which sets keyword overrides (`from_pretrained(path, pad_token_id=9)`) on the
        config it built; the result is then checked as a new config is, so a wrong override is a ValueError naming
        its field here rather than a failure inside a model. An override of None takes the default a new config
        gets (`from_pretrained(path, decoder_layers=3, decoder_max_offsets=None)`: the paper's pattern for 3 layers)."""
        result = super().from_dict(config_dict, **kwargs)
        config = result[0] if isinstance(result, tuple) else result
        checked = cls(**config.to_dict())
        for name, value in config.to_dict().items():
            if value is None and getattr(checked, name, None) is not None:
                setattr(config, name, getattr(checked, name))
        return result

    def validate_talk_hf_fields(self):
        """Part of `@strict`-powered validation (`validate()`, run by `save_pretrained`): a config changed after it
        was built (`config.d_model = 15`, `config.update(...)`) is refused before config.json is written, the
        ValueError of `check_fields` the cause of the StrictDataclassClassValidationError (as LlamaConfig refuses a
        hidden_size its heads do not divide). __post_init__ runs `check_fields` itself, so that building a config
        raises the ValueError as it is; the strict `__init__` then runs this validator again (a few comparisons)."""
        self.check_fields()

    def check_padding_token_id(self):
        """pad_token_id, which names the embeddings' padding row, lies inside the vocabulary (ValueError naming it)."""
        check_token_ids(self, "pad_token_id")

    def check_layer_lists(self):
        """Each per-layer list (LAYER_LISTS) holds one non-negative int per layer; __post_init__ builds them, but a
        layer count set afterwards (`from_pretrained(path, encoder_layers=3)`, `config.encoder_layers = 3`) needs its
        lists set too (the fields are typed list[int]: an int is refused by type)."""
        for name, count in self.LAYER_LISTS:
            value, layers = getattr(self, name), getattr(self, count)
            if not isinstance(value, list):
                raise ValueError(f"{name} must be a list with one entry per layer, got {value!r}")
            if len(value) != layers:
                raise ValueError(f"{name} has {len(value)} entries but {count} is {layers}: set {name} too, one entry "
                                 "per layer")
            if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in value):
                raise ValueError(f"{name} entries must be non-negative ints, got {value}")

    @property
    def layer_types(self):
        """The cache-layer type of each decoder layer, which transformers' cache classes read
        (`DynamicCache(config=...)`, `StaticCache`): every layer keeps a fixed-size RecurrentLayer state."""
        return [RECURRENT_LAYER_TYPE] * self.decoder_layers

    @layer_types.setter
    def layer_types(self, value):
        """`layer_types` derives from `decoder_layers`; a config.json or keyword naming it must name that list."""
        if value is not None and list(value) != self.layer_types:
            raise ValueError(f"layer_types must be {RECURRENT_LAYER_TYPE!r} for each of the {self.decoder_layers} "
                             f"decoder layers, got {value!r}")

    def validate_layer_type(self):
        """transformers checks `layer_types` against the layer types it ships; talk_hf registers its own (the
        cache layer of recurrent_cache.py), which is all these configs name."""
        if self.layer_types != [RECURRENT_LAYER_TYPE] * self.num_hidden_layers:
            raise ValueError(f"layer_types must be {RECURRENT_LAYER_TYPE!r} for every decoder layer")

    @classmethod
    def from_preset(cls, name, **overrides):
        """The papers' hyperparameters by name (see the class's PRESETS), with any field overridden."""
        if name not in cls.PRESETS:
            raise ValueError(f"unknown preset {name!r} for {cls.__name__}; choose one of {sorted(cls.PRESETS)}")
        return cls(**{**cls.PRESETS[name], **overrides})
