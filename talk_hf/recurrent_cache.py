"""The decoding cache of the talk_hf decoders: a fixed-size recurrent state per layer (TaLK prefix-sum ring,
DynamicConv input ring, RFA (S, z)) instead of a growing key/value cache; hf_integration.md §2.2.

Every tensor keeps its storage from the prefill to the last decoding step (states are written in place, the token
counters are tensors), so a decoding step has static shapes and addresses: `generate(cache_implementation="static")`
creates the cache before the first forward, which lets transformers compile the decoding step (its default
`CompileConfig` captures it in a CUDA graph on a GPU: the property this layout is for, tested there only). Without it,
`generate()` must not replace the cache: the models return False from `_supports_default_dynamic_cache`, and their
forward creates a `RecurrentCache` when `use_cache` is set.
"""

import torch
from transformers.cache_utils import Cache


def _fixed(tensor):
    """`tensor` (one the cache made itself), its address marked as fixed for torch.compile / CUDA graphs (skipped
    while tracing, and for tensors that carry gradients: backpropagation through a cache stores them as they are)."""
    if not tensor.requires_grad and not torch.compiler.is_compiling():
        torch._dynamo.mark_static_address(tensor)
    return tensor


def _owned_copy(tensor):
    """A copy the cache owns (callers may hold views of what they pass in), at a fixed address."""
    return tensor if tensor.requires_grad else _fixed(tensor.clone(memory_format=torch.contiguous_format))


# The batch rearrangements of beam search and contrastive search: new tensors rather than in place (one copy, not
# two; transformers runs those searches uncompiled), their addresses marked fixed again.
def _reordered(tensor, beam_idx):
    return _fixed(tensor.index_select(0, beam_idx.to(tensor.device)))


def _repeated(tensor, repeats):
    return _fixed(tensor.repeat_interleave(repeats, dim=0))


def _selected(tensor, indices):
    return _fixed(tensor[indices])


def _write(current, new):
    """Write `new` into the cache slot holding `current`: in place when the layout matches and no gradient flows
    (the address stays), else a new owned buffer. -> the tensor the slot holds afterwards."""
    in_place = (
        current is not None
        and not new.requires_grad
        and not current.requires_grad
        and current.shape == new.shape
        and current.dtype == new.dtype
        and current.device == new.device
    )
    if in_place:
        return current.copy_(new)
    return _owned_copy(new)


class LayerState:
    """Decoding state of one decoder layer: named tensors whose first dimension is the batch (mixer state,
    cross-attention keys/values). Duck-types the cache-layer methods that `generate()` calls."""

    is_compileable = True
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
        """Store a state; after the first time, in place (same storage at every decoding step)."""
        self.tensors[name] = _write(self.tensors.get(name), tensor)

    def reorder_cache(self, beam_idx):
        self.tensors = {name: _reordered(t, beam_idx) for name, t in self.tensors.items()}

    def batch_repeat_interleave(self, repeats):
        self.tensors = {name: _repeated(t, repeats) for name, t in self.tensors.items()}

    def batch_select_indices(self, indices):
        self.tensors = {name: _selected(t, indices) for name, t in self.tensors.items()}

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
    """O(1)-per-token decoding state of a talk_hf decoder: one `LayerState` per layer plus two token counters,
    both tensors so that a decoding step never reads a Python number that changes from step to step:

    - `length`: () int64, tokens consumed, padding included (`get_seq_length()`, which `generate()` asks once);
    - `real_tokens`: (B,) int64, real (unpadded) tokens consumed per row: the position of each row's next token.
    """

    def __init__(self, num_layers):
        super().__init__(layers=[LayerState() for _ in range(num_layers)])
        self.length = None
        self.real_tokens = None

    def get_seq_length(self, layer_idx=0):
        return 0 if self.length is None else int(self.length)

    def positions(self, new_mask, batch, length, device):
        """Positions of the next `length` tokens: (B, T). new_mask: (B, T) (1 = real token) or None (all real).
        Padded tokens get the position of the row's next real token, and do not advance it."""
        self._start_counting(batch, device)
        if new_mask is None:
            return self.real_tokens[:, None] + torch.arange(length, device=device)
        return (self.real_tokens[:, None] + new_mask.long().cumsum(-1) - 1).clamp_min(0)

    def advance(self, new_mask, batch, length, device):
        """Count `length` consumed tokens; new_mask: (B, T) or None as in `positions`."""
        self._start_counting(batch, device)
        self.length.add_(length)
        self.real_tokens.add_(length if new_mask is None else new_mask.long().sum(-1))

    def _start_counting(self, batch, device):
        if self.real_tokens is None:
            self.length = _fixed(torch.zeros((), dtype=torch.long, device=device))
            self.real_tokens = _fixed(torch.zeros(batch, dtype=torch.long, device=device))

    def reorder_cache(self, beam_idx):
        super().reorder_cache(beam_idx)
        if self.real_tokens is not None:
            self.real_tokens = _reordered(self.real_tokens, beam_idx)

    def batch_repeat_interleave(self, repeats):
        super().batch_repeat_interleave(repeats)
        if self.real_tokens is not None:
            self.real_tokens = _repeated(self.real_tokens, repeats)

    def batch_select_indices(self, indices):
        super().batch_select_indices(indices)
        if self.real_tokens is not None:
            self.real_tokens = _selected(self.real_tokens, indices)

    def reset(self):
        super().reset()
        self.length = self.real_tokens = None

    def crop(self, max_length):
        raise NotImplementedError("a recurrent state cannot be rolled back to an earlier length")

    @property
    def is_compileable(self):
        return True

    @property
    def is_croppable(self):
        return False
