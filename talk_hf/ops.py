"""Public functional API: the token-mixing ops, their references and decoding steps.

Each op picks the compiled kernel or the pure-PyTorch reference per call (talk_hf/backend.py);
`backend(device)` says which one runs for tensors on `device`.
"""

from .backend import backend, compiled_devices
from .dynamic_conv import (
    draw_seed,
    dropconnect_keep,
    dynamic_conv,
    dynamic_conv_init_state,
    dynamic_conv_ref,
    dynamic_conv_state_from_prefix,
    dynamic_conv_step,
    light_conv,
)
from .rfa import (
    rfa_causal,
    rfa_causal_chunked,
    rfa_causal_compiled,
    rfa_causal_ref,
    rfa_cross,
    rfa_cross_ref,
    rfa_cross_source,
    rfa_cross_state,
    rfa_feature_map,
    rfa_feature_map_ref,
    rfa_init_state,
    rfa_random_projection,
    rfa_step,
    rfa_step_,
)
from .talk_conv import (
    talk_conv,
    talk_conv_init_state,
    talk_conv_ref,
    talk_conv_state_from_prefix,
    talk_conv_step,
)

__all__ = [
    "backend",
    "compiled_devices",
    "draw_seed",
    "dropconnect_keep",
    "dynamic_conv",
    "dynamic_conv_init_state",
    "dynamic_conv_ref",
    "dynamic_conv_state_from_prefix",
    "dynamic_conv_step",
    "light_conv",
    "rfa_causal",
    "rfa_causal_chunked",
    "rfa_causal_compiled",
    "rfa_causal_ref",
    "rfa_cross",
    "rfa_cross_ref",
    "rfa_cross_source",
    "rfa_cross_state",
    "rfa_feature_map",
    "rfa_feature_map_ref",
    "rfa_init_state",
    "rfa_random_projection",
    "rfa_step",
    "rfa_step_",
    "talk_conv",
    "talk_conv_init_state",
    "talk_conv_ref",
    "talk_conv_state_from_prefix",
    "talk_conv_step",
]
