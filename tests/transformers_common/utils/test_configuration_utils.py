# STUB written for talk_hf -- NOT the upstream file (see ../README.md).
#
# Upstream `tests/test_configuration_common.py` does `from .utils.test_configuration_utils import config_common_kwargs`
# (used by `ConfigTester.check_config_arguments_init`). transformers' PyPI sdist does not ship `tests/utils/`, so this
# module provides only that dict: a non-default value for each common field that `PreTrainedConfig` declares in
# transformers 5.24 (configuration_utils.py), which every config must accept and store as given.

config_common_kwargs = {
    "return_dict": False,
    "output_hidden_states": True,
    "output_attentions": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["BertModel"],
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "problem_type": "regression",
}
