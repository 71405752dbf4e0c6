"""talk_hf: TaLK convolutions, LightConv/DynamicConv and RFA-doc for the HuggingFace ecosystem."""

__version__ = "0.1.0"

from . import ops  # noqa: E402,F401
