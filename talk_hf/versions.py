"""The transformers releases talk_hf supports, and the one name that differs between them: the decoding state's.

transformers 5.24 renamed the cache that `generate()` passes to a model's forward, and reads back from its outputs,
from `past_key_values` to `cache` (the output classes gained a `cache` field; `past_key_values` became a deprecated
alias). A model that reads only one of the names decodes every step from an empty state on the other releases, so
the talk_hf models take `cache`, accept `past_key_values` through `takes_cache`, and return their state under
`CACHE_NAME`, the field the installed release's output classes declare.

Importing this module checks the installed release against the supported range: below it raises ImportError,
at or past `FIRST_UNTESTED` it warns. The range is pyproject.toml's transformers requirement (a test keeps the two
equal); `.ci/run` tests both ends of it.
"""

import warnings
from functools import wraps

import transformers
from packaging.version import Version
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils.deprecation import deprecate_kwarg

OLDEST = "5.20.0"
FIRST_UNTESTED = "5.25.0"


def check_transformers_version(version):
    """Raise ImportError for a transformers `version` older than OLDEST; warn for one at or past FIRST_UNTESTED,
    its pre-releases included (a source install of transformers' main branch reports `5.25.0.dev0`, which PEP 440
    orders below 5.25.0 and pip's `<5.25.0` leaves out)."""
    if Version(version) < Version(OLDEST):
        raise ImportError(
            f"talk_hf needs transformers>={OLDEST},<{FIRST_UNTESTED}; transformers {version} is installed "
            f"(pip install 'transformers>={OLDEST},<{FIRST_UNTESTED}')"
        )
    if Version(Version(version).base_version) >= Version(FIRST_UNTESTED):
        warnings.warn(
            f"talk_hf is tested with transformers>={OLDEST},<{FIRST_UNTESTED}; transformers {version} is installed "
            "and may name or pass the decoding state differently: check that cached and uncached generation agree, "
            f"or install transformers<{FIRST_UNTESTED}",
            UserWarning,
            stacklevel=2,
        )


check_transformers_version(transformers.__version__)

# "cache" from transformers 5.24 on, "past_key_values" before
CACHE_NAME = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def cache_output(cache):
    """The keyword argument that puts a decoding state into a transformers output class: {CACHE_NAME: cache}."""
    return {CACHE_NAME: cache}


def takes_cache(forward):
    """Decorates a forward whose decoding-state argument is `cache` so that it also takes `past_key_values`.

    From transformers 5.24 on this is transformers' own `deprecate_kwarg` (as its models use it: the old name
    warns and is renamed); before, `past_key_values` is the name `generate()` passes, renamed without a warning.
    """
    if CACHE_NAME == "cache":
        return deprecate_kwarg("past_key_values", "6.0.0", new_name="cache", raise_if_both_names=True)(forward)

    @wraps(forward)
    def renamed(*args, past_key_values=None, **kwargs):
        if past_key_values is not None:
            if kwargs.get("cache") is not None:
                raise ValueError("pass the decoding state once, as `cache` or as `past_key_values`, not both")
            kwargs["cache"] = past_key_values
        return forward(*args, **kwargs)

    return renamed
