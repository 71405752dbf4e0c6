"""The decoding state of the talk_hf decoders, held in transformers' own cache classes: `DynamicCache` (decoder-only
models), `EncoderDecoderCache` (two of them: the decoder's own state and the cross-attention side), or `StaticCache`.
Each layer of those caches is a `RecurrentLayer`: a fixed-size state (TaLK prefix-sum ring, DynamicConv input ring,
RFA (S, z)) instead of a growing key/value cache, so a decoding step costs O(1) in the tokens already generated.

The configs name the layer type in `config.layer_types` ("talk_hf_recurrent" for every decoder layer), so
`DynamicCache(config=model.config)` and `StaticCache(config=model.config, max_cache_len=...)` build these layers, and
`generate()` creates them as it does for any model. A cache built without a config (`DynamicCache()`) is filled with
them on the first forward.

Every tensor keeps its storage from the prefill to the last decoding step (states are written in place, the token
counters are tensors), so a decoding step has static shapes and addresses: with `cache_implementation="static"`
transformers compiles the decoding step (its default `CompileConfig` captures it in a CUDA graph on a GPU).
"""

import torch
from transformers.cache_utils import (
    STATIC_LAYER_TYPE_MAPPING,
    Cache,
    DynamicCache,
    EncoderDecoderCache,
    LinearAttentionAndFullAttentionLayer,
)

LAYER_TYPE = "talk_hf_recurrent"


def _fixed(tensor):
    """`tensor` (one the cache made itself), its address marked as fixed for torch.compile / CUDA graphs (skipped
    while tracing, and for tensors that carry gradients: backpropagation through a cache stores them as they are)."""
    if not tensor.requires_grad and not torch.compiler.is_compiling():
        torch._dynamo.mark_static_address(tensor)
    return tensor


def _owned_copy(tensor):
    """A copy the cache owns (callers may hold views of what they pass in), at a fixed address."""
    return tensor if tensor.requires_grad else _fixed(tensor.clone(memory_format=torch.contiguous_format))


def _contiguous(tensor):
    """`tensor` itself when contiguous, else a contiguous copy; its address marked as fixed."""
    return _fixed(tensor.contiguous())


def _frozen(tensor):
    """Whether `tensor` was made under torch.inference_mode() and is used outside it, where it cannot be written in
    place (a cache filled by a generate() call under inference mode, continued by one outside it)."""
    return not torch.compiler.is_compiling() and tensor.is_inference() and not torch.is_inference_mode_enabled()


def _thawed(tensor):
    """`tensor`, or a writable copy at a fixed address where it is `_frozen`."""
    return _fixed(tensor.clone()) if _frozen(tensor) else tensor


def _same_layout(a, b):
    """Whether `a` can be overwritten with a tensor like `b`: the same shape, dtype and device."""
    return (a.shape, a.dtype, a.device) == (b.shape, b.dtype, b.device)


def _write(current, new, handed_over=False):
    """Write `new` into the cache slot holding `current`: in place when the layout matches and no gradient flows
    (the address stays), else a new owned buffer: `new` itself when `handed_over` (a tensor no one else holds, kept
    without a copy; made contiguous), else a copy. -> the tensor the slot holds afterwards."""
    in_place = (current is not None and not new.requires_grad and not current.requires_grad
                and _same_layout(current, new) and not _frozen(current))
    if in_place:
        return current.copy_(new)
    if handed_over and not new.requires_grad:
        return _contiguous(new)
    return _owned_copy(new)


class RecurrentLayer(LinearAttentionAndFullAttentionLayer):
    """One talk_hf decoder layer's decoding state: transformers' linear-attention cache layer (fixed-size
    `conv_states` / `recurrent_states`) together with its attention part (`keys` / `values`), used for the
    cross-attention source. As a layer of the decoder's own cache (a `DynamicCache` / `StaticCache`, or the self side
    of an `EncoderDecoderCache`):

        conv_states[0]:      DynamicConv's last K - 1 inputs (B, K - 1, C), or TaLK's prefix-sum ring
                             (B, max_left + 2, C); time runs along dim 1;
        recurrent_states[0]: RFA's (S, z) state (B, H, F, d + 1);
        cumulative_length:   () int64, tokens consumed, padding included (`get_seq_length()`);
        real_tokens:         (B,) int64, real (unpadded) tokens consumed per row: the position of each row's next token.

    As a layer of the cross-attention side of an `EncoderDecoderCache`, the source prepared once per source:

        keys, values:        encoder keys and values (B, H, S, C/H), or RFA's key features and values for short sources;
        recurrent_states[0]: RFA's source state (B, H, F, d + 1) for long sources;
        rows_per_source:     how many consecutive decoder rows share each source row (beam search's hypotheses of
                             one source: generate() repeats every source once per beam), so B is the number of
                             distinct sources; 1 when every row has its own.

    It extends the library's layer with what these decoders need and the library's lacks: whole-state writes (the
    library's `update_conv_state` appends new inputs to a window, while the talk_hf step ops return the next state
    whole), token counters (the positions of left-padded rows; a linear-attention layer counts nothing), batch
    rearrangement of every tensor (contrastive search), and a compileable, non-croppable state.
    """

    _layer_type = LAYER_TYPE  # registers the class with DynamicCache's layer types (a non-static layer class)
    is_compileable = True  # fixed shapes, written in place (the library's hybrid layer grows its keys at each step)
    is_croppable = False  # a recurrent state cannot be rolled back to an earlier length

    def __init__(self, number_of_states=1, **kwargs):
        """kwargs: what the cache classes pass to any layer (StaticCache's max_cache_len): a fixed-size state
        needs none of it."""
        super().__init__(number_of_states=number_of_states)
        self.cumulative_length = None
        self.real_tokens = None
        self.counting = False  # whether tokens were consumed since the layer was made or reset
        self._spares = {}  # beam search: per state slot, the buffer the next reorder gathers into
        self.rows_per_source = 1

    # -- the fixed-size states

    def conv_state(self, state_idx=0):
        """The conv state, or None before the first write (and after `reset`); writable in place (the decoding ops
        may update it so)."""
        return self._stored(self.conv_states, state_idx)

    def recurrent_state(self, state_idx=0):
        """The recurrent state, or None before the first write (and after `reset`); writable in place (the decoding
        ops may update it so)."""
        return self._stored(self.recurrent_states, state_idx)

    def _stored(self, states, state_idx):
        if not self.has_previous_state[state_idx] or states[state_idx] is None:  # one flag covers both kinds
            return None
        states[state_idx] = _thawed(states[state_idx])
        return states[state_idx]

    def write_conv_state(self, state, state_idx=0):
        """Store the whole conv state (in place after the first write) -> the stored tensor."""
        return self._write_state(self.conv_states, self.is_conv_states_initialized, state, state_idx)

    def write_recurrent_state(self, state, state_idx=0, handed_over=False):
        """Store the whole recurrent state (in place after the first write) -> the stored tensor. `handed_over`: the
        caller made `state` and keeps no reference to it, so a first write stores it without a copy (a state can be
        tens of MB per layer: RFA-doc's source state at batch 24, the causal state at batch 256)."""
        return self._write_state(self.recurrent_states, self.is_recurrent_states_initialized, state, state_idx,
                                 handed_over)

    def _write_state(self, states, initialized, state, state_idx, handed_over=False):
        states[state_idx] = _write(states[state_idx], state, handed_over)
        initialized[state_idx] = self.has_previous_state[state_idx] = True
        self.device, self.dtype = state.device, state.dtype
        return states[state_idx]

    # -- the cross-attention source

    def update(self, key_states, value_states, *args, **kwargs):
        """The library's key/value append, which an attention model calls on its cache's layers: refused, since
        this layer holds a recurrent state (a cache built from a talk_hf config, or returned by a talk_hf model,
        reached an attention model). The talk_hf decoders store their cross-attention source with `store_source`."""
        raise ValueError("this cache layer holds a talk_hf model's recurrent decoding state, not a growing key/value "
                         "cache: an attention model cannot decode with it; give that model its own cache "
                         "(DynamicCache(), or DynamicCache(config=<that model's config>))")

    def store_source(self, key_states, value_states):
        """Store the cross-attention keys and values of one source (replacing any earlier source's) -> both.
        Contiguous tensors are kept as given (the cache then shares them: a source's keys can be tens of MB, and
        they are not written again); others are copied into contiguous ones."""
        self.keys, self.values = _contiguous(key_states), _contiguous(value_states)
        self.is_initialized = True
        self.device, self.dtype = key_states.device, key_states.dtype
        return self.keys, self.values

    def has_source(self):
        """Whether this (cross-attention side) layer holds a source."""
        return self.keys is not None or self.recurrent_state() is not None

    # -- the token counters

    def positions(self, new_mask, batch, length, device):
        """Positions of the next `length` tokens: (B, T). new_mask: (B, T) (1 = real token) or None (all real).
        Padded tokens get the position of the row's next real token, and do not advance it."""
        self.start_counting(batch, device)
        if new_mask is None:
            return self.real_tokens[:, None] + torch.arange(length, device=device)
        return (self.real_tokens[:, None] + new_mask.long().cumsum(-1) - 1).clamp_min(0)

    def advance(self, new_mask, batch, length, device):
        """Count `length` consumed tokens; new_mask: (B, T) or None as in `positions`."""
        self.start_counting(batch, device)
        self.cumulative_length, self.real_tokens = _thawed(self.cumulative_length), _thawed(self.real_tokens)
        self.cumulative_length.add_(length)
        self.real_tokens.add_(length if new_mask is None else new_mask.long().sum(-1))
        self.counting = True

    def start_counting(self, batch, device):
        """Make the token counters for `batch` rows, unless they exist; a reset layer takes a batch of any size, a
        layer that counted tokens of another batch size is refused (ValueError)."""
        if self.real_tokens is not None and self.real_tokens.shape[0] != batch:
            if self.counting:
                raise ValueError(f"the cache holds the decoding state of {self.real_tokens.shape[0]} sequences and the "
                                 f"input has {batch}: continue with the sequences it decoded, or reset() it first")
            self.cumulative_length = self.real_tokens = None
        if self.real_tokens is None:
            self.cumulative_length = _fixed(torch.zeros((), dtype=torch.long, device=device))
            self.real_tokens = _fixed(torch.zeros(batch, dtype=torch.long, device=device))

    def get_seq_length(self):
        return 0 if self.cumulative_length is None else int(self.cumulative_length)

    def get_mask_sizes(self, query_length):
        return self.get_seq_length() + query_length, 0

    def get_max_length(self):
        return -1

    # -- whole-cache operations

    def reset(self):
        """Back to the state before the first token, keeping every state's storage (static addresses); the
        cross-attention source is dropped (the next prefill brings its own)."""
        for i in range(self.number_of_states):
            for states, initialized in (
                (self.conv_states, self.is_conv_states_initialized),
                (self.recurrent_states, self.is_recurrent_states_initialized),
            ):
                if initialized[i]:
                    states[i] = _thawed(states[i]).zero_()
            self.has_previous_state[i] = False
        self.keys = self.values = None
        self.is_initialized = False
        self.rows_per_source = 1
        self.counting = False
        if self.real_tokens is not None:
            self.cumulative_length = _thawed(self.cumulative_length).zero_()
            self.real_tokens = _thawed(self.real_tokens).zero_()

    def crop(self, tokens_to_remove):
        raise NotImplementedError("a recurrent state cannot be rolled back to an earlier length")

    def activate_past_recording(self):
        """Assisted generation asks its draft model's cache to record past states, to roll back the draft tokens
        the main model rejects; a recurrent state cannot be rolled back, so it is refused before any draft."""
        raise ValueError("a talk_hf model cannot be an assistant (draft) model: its recurrent decoding state cannot "
                         "be rolled back to drop rejected draft tokens; generate without assistant_model")

    def reorder_cache(self, beam_idx):
        """Beam search (uncompiled in transformers): every tensor gathered along the batch. The fixed-size states are
        gathered into a spare buffer of their shape, and the state a gather replaces becomes the next gather's spare,
        so beam search keeps two buffers of each state instead of allocating one per step: a new buffer of tens of
        MB costs more than the gather itself on the CPU, where its pages are mapped on first write (a (256, 8, 64,
        65) fp32 RFA state, one thread: 26 ms into a new tensor, 6 ms into a spare). The keys, values and counters
        (the cache may share keys with its caller) are gathered into new tensors."""

        def select(t):
            return t.index_select(0, beam_idx.to(t.device))

        def gather(state, slot):
            if state.requires_grad:  # out= has no autograd
                return select(state)
            spare = self._spares.get(slot)
            if spare is None or not _same_layout(spare, state) or _frozen(spare):
                spare = torch.empty_like(state)
            self._spares[slot] = state
            return torch.index_select(state, 0, beam_idx.to(state.device), out=spare)

        self._map_batch(select, state_fn=gather)

    def batch_repeat_interleave(self, repeats):
        self._map_batch(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices):
        self._map_batch(lambda t: t[indices])

    def _map_batch(self, fn, state_fn=None):
        """Apply a batch rearrangement to every tensor this layer holds: fn(tensor) -> the rearranged tensor;
        state_fn(state, slot), if given, rearranges the fixed-size states instead (slot: ("conv_states", i) or
        ("recurrent_states", i)). A source shared by several rows is first repeated for each of them, so that `fn`
        sees one row per decoder row."""
        if self.rows_per_source > 1:
            self._unshare_source()
        for name in ("conv_states", "recurrent_states"):
            states = getattr(self, name)
            for i, t in states.items():
                if t is not None:
                    states[i] = _fixed(fn(t) if state_fn is None else state_fn(t, (name, i)))
        if self.keys is not None:
            self.keys, self.values = _fixed(fn(self.keys)), _fixed(fn(self.values))
        if self.real_tokens is not None:
            self.real_tokens = _fixed(fn(self.real_tokens))

    def _unshare_source(self):
        """One source row per decoder row (the rows that shared a source repeated)."""
        rows, self.rows_per_source = self.rows_per_source, 1
        if self.keys is not None:
            self.keys, self.values = (_fixed(t.repeat_interleave(rows, dim=0)) for t in (self.keys, self.values))
        for i, t in self.recurrent_states.items():
            if t is not None:
                self.recurrent_states[i] = _fixed(t.repeat_interleave(rows, dim=0))


# The layer type's auto-registration fills DynamicCache's mapping only (RecurrentLayer is not a StaticLayer);
# a fixed-size state is the same layer in a StaticCache.
STATIC_LAYER_TYPE_MAPPING[LAYER_TYPE] = RecurrentLayer


def is_foreign_recurrent_layer(layer):
    """Whether `layer` is a RecurrentLayer of another copy of this module (the same layer type, another class)."""
    return getattr(layer, "_layer_type", None) == LAYER_TYPE and not isinstance(layer, RecurrentLayer)


def recurrent_layers(cache, num_layers):
    """The `num_layers` RecurrentLayers of `cache` (one side of it), filling a cache created without a config
    (`DynamicCache()`, still empty) with them; any other cache layout is refused, naming what was found."""
    if len(cache.layers) == 0 and getattr(cache, "layer_class_to_replicate", None) is not None:
        cache.layers.extend(RecurrentLayer() for _ in range(num_layers))
    for i, layer in enumerate(cache.layers):
        # the layer class of another copy of this code (remote code loaded from a second revision or folder
        # registers its own copy under the same layer type, and the cache classes build the last one registered):
        # an empty one is replaced by this copy's, a filled one (a continued generation) kept
        filled = layer.is_initialized or any(getattr(layer, "has_previous_state", {}).values())
        if is_foreign_recurrent_layer(layer) and not filled:
            cache.layers[i] = RecurrentLayer()
    found = [f"{type(layer).__module__}.{type(layer).__name__}" for layer in cache.layers
             if getattr(layer, "_layer_type", None) != LAYER_TYPE]
    if len(cache.layers) != num_layers or found:
        raise ValueError(
            f"a talk_hf decoder with {num_layers} layers keeps a fixed-size state per layer in RecurrentLayer cache "
            f"layers; the cache passed has {len(cache.layers)} layers ({', '.join(found) or 'RecurrentLayer'}): "
            "create it with DynamicCache(config=model.config) (EncoderDecoderCache of two of them for an "
            "encoder-decoder model), or let the model create it"
        )
    return cache.layers


def decoder_cache(cache, cross_attention):
    """The cache a decoder works on: `cache` itself, a new one when None, and for a decoder with cross-attention an
    `EncoderDecoderCache` (a lone cache becomes its self-attention side) -> Cache."""
    if cache is None:
        cache = DynamicCache()
    if not isinstance(cache, Cache):
        raise TypeError(
            f"cache must be a transformers Cache (e.g. DynamicCache(config=model.config)), got {type(cache).__name__}"
        )
    if cross_attention and not isinstance(cache, EncoderDecoderCache):
        cache = EncoderDecoderCache(cache, DynamicCache())
    return cache
