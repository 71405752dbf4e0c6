"""The decoding cache of the talk_hf decoders: a fixed-size recurrent state per layer (TaLK prefix-sum ring,
DynamicConv input ring, RFA (S, z)) instead of a growing key/value cache; hf_integration.md §2.2.

`generate()` must not replace it: the models return False from `_supports_default_dynamic_cache`, and their
forward creates a `RecurrentCache` when `use_cache` is set.
"""

from transformers.cache_utils import Cache


class LayerState:
    """Decoding state of one decoder layer: named tensors whose first dimension is the batch (mixer state,
    cross-attention keys/values). Duck-types the cache-layer methods that `generate()` calls."""

    is_compileable = False
    is_sliding = False
    is_croppable = False
    supports_early_init = False

    def __init__(self):
        self.tensors = {}

    @property
    def is_initialized(self):
        return bool(self.tensors)

    def get(self, name):
        return self.tensors.get(name)

    def set(self, name, tensor):
        self.tensors[name] = tensor

    def reorder_cache(self, beam_idx):
        for name, t in self.tensors.items():
            self.tensors[name] = t.index_select(0, beam_idx.to(t.device))

    def batch_repeat_interleave(self, repeats):
        for name, t in self.tensors.items():
            self.tensors[name] = t.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices):
        for name, t in self.tensors.items():
            self.tensors[name] = t[indices]

    def reset(self):
        self.tensors = {}

    def crop(self, max_length):
        raise NotImplementedError("a recurrent state cannot be rolled back to an earlier length")

    def offload(self):
        pass

    def prefetch(self):
        pass

    def get_max_length(self):
        return -1


class RecurrentCache(Cache):
    """O(1)-per-token decoding state of a talk_hf decoder: one `LayerState` per layer plus the number of tokens
    consumed (used for positions and by `generate()`)."""

    def __init__(self, num_layers):
        super().__init__(layers=[LayerState() for _ in range(num_layers)])
        self.seen_tokens = 0

    def get_seq_length(self, layer_idx=0):
        return self.seen_tokens

    def advance(self, num_tokens):
        self.seen_tokens += num_tokens

    def reset(self):
        super().reset()
        self.seen_tokens = 0

    def crop(self, max_length):
        raise NotImplementedError("a recurrent state cannot be rolled back to an earlier length")

    @property
    def is_compileable(self):
        return False

    @property
    def is_croppable(self):
        return False
