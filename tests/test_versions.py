"""The supported transformers range and the decoding state's name (talk_hf/versions.py)."""

import re
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from packaging.requirements import Requirement
from packaging.version import Version

from talk_hf import versions
from tests.models.tiny import VOCAB, cache_of, make, source_batch

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_declares_the_range_the_package_checks():
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    requirements = [Requirement(line) for line in project["dependencies"]]
    (transformers_requirement,) = [r for r in requirements if r.name == "transformers"]
    assert transformers_requirement.specifier == f">={versions.OLDEST},<{versions.FIRST_UNTESTED}"
    assert transformers_requirement.specifier.contains(transformers.__version__)  # what these tests run on


def test_an_older_transformers_is_refused_with_the_range():
    with pytest.raises(ImportError, match=r"transformers>=5\.20\.0,<5\.25\.0.*5\.19\.1 is installed"):
        versions.check_transformers_version("5.19.1")


def test_a_newer_transformers_warns_and_the_range_is_silent():
    with pytest.warns(UserWarning, match=r"tested with transformers>=5\.20\.0,<5\.25\.0; transformers 5\.25\.0"):
        versions.check_transformers_version("5.25.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for version in (versions.OLDEST, "5.24.0", "5.24.9"):
            versions.check_transformers_version(version)


@pytest.mark.parametrize("version", ["5.25.0.dev0", "5.25.0rc1", "5.25.0a1"])
def test_a_prerelease_of_the_first_untested_release_warns(version):
    """A source install of transformers' main branch reports the next release as a .dev0 pre-release, which PEP 440
    orders below that release; pip's `<5.25.0` leaves it out, and so does the check."""
    with pytest.warns(UserWarning, match=f"transformers {re.escape(version)} is installed"):
        versions.check_transformers_version(version)


def test_the_cache_name_is_the_installed_outputs_field():
    renamed = Version(transformers.__version__) >= Version("5.24.0")
    assert versions.CACHE_NAME == ("cache" if renamed else "past_key_values")


@pytest.mark.parametrize("name", ["talk", "rfa_doc", "talk_lm"])
def test_the_state_is_taken_under_either_name(name):
    model = make(name)
    ids, mask = source_batch()
    if model.config.is_encoder_decoder:
        inputs = {"input_ids": ids, "attention_mask": mask}
        key = "decoder_input_ids"
    else:
        inputs, key = {}, "input_ids"
    tokens = torch.randint(5, VOCAB, (ids.shape[0], 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(**inputs, **{key: tokens}).logits[:, -1]
        prefix = cache_of(model(**inputs, **{key: tokens[:, :5]}, use_cache=True))
        new = model(**inputs, **{key: tokens[:, 5:]}, cache=prefix, use_cache=True).logits[:, -1]
        torch.testing.assert_close(new, full)
        prefix = cache_of(model(**inputs, **{key: tokens[:, :5]}, use_cache=True))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the deprecated name, from transformers 5.24 on
            old = model(**inputs, **{key: tokens[:, 5:]}, past_key_values=prefix, use_cache=True).logits[:, -1]
        torch.testing.assert_close(old, full)
        with pytest.raises(ValueError, match="past_key_values"):
            model(**inputs, **{key: tokens[:, 5:]}, cache=prefix, past_key_values=prefix, use_cache=True)
