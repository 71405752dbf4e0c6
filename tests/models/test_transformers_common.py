"""transformers' OWN common model tests, run against every talk_hf model class as a third-party model package would.

`ModelTesterMixin` (tests/test_modeling_common.py) and `ConfigTester` (tests/test_configuration_common.py) are
vendored from the transformers 5.24.0 sdist in tests/transformers_common/ (its README.md lists the files and every
change). That sdist does not ship tests/generation/, so `GenerationTesterMixin` there is an empty stand-in and no
upstream `generate()` test runs here (talk_hf's own generation tests are in test_modeling_common.py and
test_compiled_generation.py of this folder).

Each model type has a ModelTester (as transformers' tests/models/bart/test_modeling_bart.py and
tests/models/mamba/test_modeling_mamba.py have) and a TestCase mixing the upstream mixins in. Upstream tests that
cannot apply to these recurrent models skip themselves through the same class attributes transformers' Mamba and
xLSTM tests set (`has_attentions = False`), or through their own gates (no accelerator, no RoPE, not composite...);
a talk_hf defect an upstream test finds is fixed, or marked `xfail(strict=True)` naming it, never skipped.
"""

import unittest
import warnings
from unittest import mock

import pytest
import transformers

UPSTREAM_RELEASE = "5.24"  # the release tests/transformers_common was vendored from
if transformers.__version__.split(".")[:2] != UPSTREAM_RELEASE.split("."):
    pytest.skip(
        f"tests/transformers_common holds transformers {UPSTREAM_RELEASE}.0's own test mixins, written against that "
        f"release's internals; transformers {transformers.__version__} is installed",
        allow_module_level=True,
    )

import torch  # noqa: E402
from transformers.models.auto import modeling_auto  # noqa: E402

from talk_hf import (  # noqa: E402
    DynamicConvConfig,
    DynamicConvForCausalLM,
    DynamicConvForConditionalGeneration,
    DynamicConvLMConfig,
    DynamicConvLMModel,
    DynamicConvModel,
    RfaDocConfig,
    RfaDocForConditionalGeneration,
    RfaDocModel,
    TalkConfig,
    TalkForCausalLM,
    TalkForConditionalGeneration,
    TalkLMConfig,
    TalkLMModel,
    TalkModel,
)
from tests.transformers_common.generation.test_utils import GenerationTesterMixin  # noqa: E402
from tests.transformers_common.test_configuration_common import ConfigTester  # noqa: E402

with warnings.catch_warnings():
    # the upstream tests carry transformers' own pytest marks (flash_attn_test, accelerate_tests, ...), registered in
    # transformers' conftest.py, not here
    warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
    from tests.transformers_common.test_modeling_common import ModelTesterMixin, ids_tensor  # noqa: E402

# ---------------------------------------------------------------------------------------------------------------
# Registration by name. The upstream tests decide what a class is from transformers' name tables
# (`get_values(MODEL_MAPPING_NAMES)`: a base model, trained without labels; `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` /
# `MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES`: heads that get `labels` from `_prepare_for_class`, and so on).
# talk_hf registers its classes with the Auto classes (`AutoModel.register`), which fills the lazy mappings but not
# those name tables, so each TestCase adds its model type to them while it runs, as if the model were in transformers.

_NAME_TABLES = {
    "MODEL_MAPPING_NAMES": {
        "talk": "TalkModel",
        "talk_lm": "TalkLMModel",
        "dynamic_conv": "DynamicConvModel",
        "dynamic_conv_lm": "DynamicConvLMModel",
        "rfa_doc": "RfaDocModel",
    },
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES": {
        "talk": "TalkForConditionalGeneration",
        "dynamic_conv": "DynamicConvForConditionalGeneration",
        "rfa_doc": "RfaDocForConditionalGeneration",
    },
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": {
        "talk_lm": "TalkForCausalLM",
        "dynamic_conv_lm": "DynamicConvForCausalLM",
    },
}


# ---------------------------------------------------------------------------------------------------------------
# Model testers: tiny configs (d_model 16, 2 layers), inputs as transformers' own testers build them.


class _TalkHfModelTester:
    """Shared part of the talk_hf model testers (the attributes ModelTesterMixin reads)."""

    config_class = None
    is_encoder_decoder = False

    def __init__(self, parent, batch_size=4, seq_length=7, is_training=True, vocab_size=99, hidden_size=16,
                 num_hidden_layers=2, intermediate_size=24, hidden_dropout_prob=0.1, pad_token_id=1, bos_token_id=0,
                 eos_token_id=2):
        self.parent = parent
        self.batch_size = batch_size
        self.seq_length = seq_length
        self.is_training = is_training
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.intermediate_size = intermediate_size
        self.hidden_dropout_prob = hidden_dropout_prob
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        if self.is_encoder_decoder:
            self.encoder_seq_length = self.decoder_seq_length = seq_length

    def config_kwargs(self):
        """The keyword arguments of the tiny config (also what ConfigTester checks round-trip through JSON)."""
        raise NotImplementedError

    def get_config(self):
        return self.config_class(**self.config_kwargs())

    def _common_kwargs(self):
        return dict(
            vocab_size=self.vocab_size, d_model=self.hidden_size, decoder_layers=self.num_hidden_layers,
            decoder_ffn_dim=self.intermediate_size, dropout=self.hidden_dropout_prob, pad_token_id=self.pad_token_id,
            bos_token_id=self.bos_token_id, eos_token_id=self.eos_token_id,
        )

    def prepare_config_and_inputs(self):
        # no special ids (0-2) inside the sequences, as transformers' Bart tester does
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        attention_mask = torch.ones_like(input_ids)
        inputs_dict = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.is_encoder_decoder:
            input_ids[:, -1] = self.eos_token_id
            decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
            inputs_dict["decoder_input_ids"] = decoder_input_ids
            inputs_dict["decoder_attention_mask"] = torch.ones_like(decoder_input_ids)
        return self.get_config(), inputs_dict

    def prepare_config_and_inputs_for_common(self):
        return self.prepare_config_and_inputs()


class TalkModelTester(_TalkHfModelTester):
    config_class = TalkConfig
    is_encoder_decoder = True

    def config_kwargs(self):
        return dict(
            self._common_kwargs(), encoder_layers=self.num_hidden_layers, encoder_ffn_dim=self.intermediate_size,
            encoder_heads=2, decoder_heads=4, decoder_attention_heads=2, encoder_max_offsets=[1, 4],
            encoder_max_right_offsets=[3, 0], decoder_max_offsets=[2, 5], attention_dropout=0.1, offset_dropout=0.1,
        )


class TalkLMModelTester(_TalkHfModelTester):
    config_class = TalkLMConfig

    def config_kwargs(self):
        return dict(self._common_kwargs(), decoder_heads=2, decoder_max_offsets=[2, 6], offset_dropout=0.1)


class DynamicConvModelTester(_TalkHfModelTester):
    config_class = DynamicConvConfig
    is_encoder_decoder = True

    def config_kwargs(self):
        return dict(
            self._common_kwargs(), encoder_layers=self.num_hidden_layers, encoder_ffn_dim=self.intermediate_size,
            encoder_conv_heads=2, decoder_conv_heads=4, decoder_attention_heads=2, encoder_kernel_sizes=[3, 4],
            decoder_kernel_sizes=[3, 7], attention_dropout=0.1, weight_dropout=0.1,
        )


class DynamicConvLMModelTester(_TalkHfModelTester):
    config_class = DynamicConvLMConfig

    def config_kwargs(self):
        return dict(self._common_kwargs(), decoder_conv_heads=2, decoder_kernel_sizes=[3, 5], weight_dropout=0.1)


class RfaDocModelTester(_TalkHfModelTester):
    config_class = RfaDocConfig
    is_encoder_decoder = True
    sep_token_id = 4

    def config_kwargs(self):
        return dict(
            self._common_kwargs(), encoder_layers=self.num_hidden_layers, encoder_ffn_dim=self.intermediate_size,
            encoder_attention_heads=2, decoder_attention_heads=2, causal_num_frequencies=8, cross_num_frequencies=8,
            attention_dropout=0.1, sep_token_id=self.sep_token_id,
        )

    def prepare_config_and_inputs(self):
        config, inputs_dict = super().prepare_config_and_inputs()
        # a sentence separator in the middle of every target row and nowhere else: the decoder's sentential gate always
        # acts, at known positions (ids_tensor alone draws it now and then)
        ids = inputs_dict["decoder_input_ids"]
        ids.masked_fill_(ids == self.sep_token_id, self.sep_token_id + 1)
        ids[:, self.seq_length // 2] = self.sep_token_id
        # the gate reads the separators from decoder_input_ids; tests that pass decoder_inputs_embeds instead need
        # them as decoder_separators (ignored next to decoder_input_ids)
        inputs_dict["decoder_separators"] = ids == self.sep_token_id
        return config, inputs_dict


class _TalkHfModelTest(ModelTesterMixin, GenerationTesterMixin):
    """ModelTesterMixin settings every talk_hf model shares."""

    model_tester_class = None
    common_properties = None
    # As transformers' Mamba and xLSTM tests set it (`has_attentions = False  # Mamba does not support attentions`):
    # the token mixers (TaLK and DynamicConv convolutions, RFA's linear recurrence) have no attention matrix to
    # output, and the softmax parts (cross-attention, the RFA-doc encoder) run through scaled_dot_product_attention
    # without returning weights: output_attentions=True is refused (modeling_base.refuse_attention_weights). This
    # skips the upstream attention tests (test_attention_outputs, the sdpa/eager dispatch tests, the attention parts
    # of others).
    has_attentions = False
    # The upstream gate skips models whose config file has no copyright line from 2023 on ("Not a prioritized
    # model for now"); a model package written now is expected to initialise every weight in _init_weights.
    test_can_init_all_missing_weights_before_2023 = True

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        for table, entries in _NAME_TABLES.items():
            cls.enterClassContext(mock.patch.dict(getattr(modeling_auto, table), entries))

    def setUp(self):
        self.model_tester = self.model_tester_class(self)
        self.config_tester = ConfigTester(
            self, config_class=self.model_tester.config_class, common_properties=self.common_properties,
            **self.model_tester.config_kwargs(),
        )

    def test_config(self):
        self.config_tester.run_common_tests()


class TalkModelTest(_TalkHfModelTest, unittest.TestCase):
    model_tester_class = TalkModelTester
    all_model_classes = (TalkModel, TalkForConditionalGeneration)
    all_generative_model_classes = (TalkForConditionalGeneration,)
    is_encoder_decoder = True


class TalkLMModelTest(_TalkHfModelTest, unittest.TestCase):
    model_tester_class = TalkLMModelTester
    all_model_classes = (TalkLMModel, TalkForCausalLM)
    all_generative_model_classes = (TalkForCausalLM,)
    # as transformers' Mamba / RWKV / xLSTM testers: LM configs map no `num_attention_heads`
    common_properties = ["hidden_size", "num_hidden_layers"]


class DynamicConvModelTest(_TalkHfModelTest, unittest.TestCase):
    model_tester_class = DynamicConvModelTester
    all_model_classes = (DynamicConvModel, DynamicConvForConditionalGeneration)
    all_generative_model_classes = (DynamicConvForConditionalGeneration,)
    is_encoder_decoder = True


class DynamicConvLMModelTest(_TalkHfModelTest, unittest.TestCase):
    model_tester_class = DynamicConvLMModelTester
    all_model_classes = (DynamicConvLMModel, DynamicConvForCausalLM)
    all_generative_model_classes = (DynamicConvForCausalLM,)
    common_properties = ["hidden_size", "num_hidden_layers"]


class RfaDocModelTest(_TalkHfModelTest, unittest.TestCase):
    model_tester_class = RfaDocModelTester
    all_model_classes = (RfaDocModel, RfaDocForConditionalGeneration)
    all_generative_model_classes = (RfaDocForConditionalGeneration,)
    is_encoder_decoder = True

