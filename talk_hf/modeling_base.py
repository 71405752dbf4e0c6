"""Building blocks shared by the talk_hf models: positions, softmax attention, feed-forward, residual layers,
encoder/decoder stacks (the decoding state in transformers' cache classes, recurrent_cache.py), and the four model
classes every family derives from: RecurrentSeq2SeqModel and RecurrentSeq2SeqLM (encoder-decoder),
RecurrentCausalLMModel and RecurrentCausalLM (decoder-only), each with its forward (the two heads share
RecurrentLMHead).

The models differ only in their token mixers (modeling_talk.py, modeling_dynamic_conv.py, modeling_rfa_doc.py);
everything else lives here once. A mixer is an nn.Module called as

    mixer(x, attention_mask=None, cache=None, separators=None) -> (B, T, C)

with x: (B, T, C); attention_mask: (B, T), 1 for real tokens; cache: the layer's `RecurrentLayer` (recurrent_cache.py)
when decoding with a cache; separators: (B, T) bool, sentence-separator positions (used by the RFA-doc gate only).
A cross-attention module is called as cross(x, encoder_hidden_states, encoder_attention_mask, cache), its cache the
layer's RecurrentLayer on the cross-attention side of the EncoderDecoderCache.
"""

import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.cache_utils import EncoderDecoderCache
from transformers.loss.loss_utils import ForMaskedLMLoss
from transformers.utils import can_return_tuple, logging

from .backend import needs_grad
from .recurrent_cache import decoder_cache, recurrent_layers
from .versions import CACHE_NAME, cache_output, takes_cache

logger = logging.get_logger(__name__)

# ---------------------------------------------------------------------------------------------------------------
# Positions and masks


def sinusoidal_positions(positions, dim):
    """Sinusoidal position embeddings, [sin | cos] halves (fairseq layout), for any position (no table, no maximum).

    positions: (B, T) int -> (B, T, dim) float32.
    """
    half = dim // 2
    scale = math.log(10000.0) / max(half - 1, 1)
    freqs = torch.exp(torch.arange(half, device=positions.device, dtype=torch.float32) * -scale)
    angles = positions.float().unsqueeze(-1) * freqs
    emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    return F.pad(emb, (0, dim % 2))


def positions_from_mask(attention_mask, length):
    """Positions counting real tokens only, for the last `length` columns of a (B, T_total) mask -> (B, length).

    Padding on either side then does not shift the positions of real tokens."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)[:, -length:]


def shift_tokens_right(labels, pad_token_id, decoder_start_token_id):
    """Decoder inputs from labels: (B, T) -> (B, T), start token in front, -100 replaced by the pad id."""
    if decoder_start_token_id is None:
        raise ValueError("config.decoder_start_token_id must be set to build decoder inputs from labels")
    shifted = labels.new_empty(labels.shape)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def zero_padding(x, attention_mask):
    """x: (B, T, C), attention_mask: (B, T) or None -> x with padded positions set to zero."""
    return x if attention_mask is None else x * attention_mask.unsqueeze(-1).to(x.dtype)


# ---------------------------------------------------------------------------------------------------------------
# Sub-layers


class FeedForward(nn.Module):
    """Position-wise feed-forward: fc2(dropout(act(fc1(x)))). initialise: how `_init_weights` initialises fc1 and
    fc2 (`initialised_linear`; None: as every Linear)."""

    def __init__(self, d_model, ffn_dim, activation, activation_dropout, initialise=None):
        super().__init__()
        self.fc1 = initialised_linear(d_model, ffn_dim, initialise)
        self.fc2 = initialised_linear(ffn_dim, d_model, initialise)
        self.act = ACT2FN[activation]
        self.activation_dropout = activation_dropout

    def forward(self, x):
        x = F.dropout(self.act(self.fc1(x)), p=self.activation_dropout, training=self.training)
        return self.fc2(x)


def linear_default_bias_(linear):
    """nn.Linear's own bias initialisation, U(-in_features**-0.5, in_features**-0.5)."""
    from transformers import initialization as init

    bound = linear.in_features**-0.5
    init.uniform_(linear.bias, -bound, bound)


def torch_default_linear_(linear, config=None):
    """Initialise `linear` as nn.Linear initialises itself (kaiming-uniform with a = 5**0.5, i.e.
    U(-in_features**-0.5, in_features**-0.5), and the same for its bias), which the reference code keeps for some
    layers."""
    from transformers import initialization as init

    bound = linear.in_features**-0.5
    init.uniform_(linear.weight, -bound, bound)
    linear_default_bias_(linear)


def attention_input_linear_(linear, config=None):
    """Initialise a q/k/v projection of softmax attention as fairseq's MultiheadAttention does: xavier-uniform with
    gain 2**-0.5, nn.Linear's own bias."""
    from transformers import initialization as init

    init.xavier_uniform_(linear.weight, gain=2**-0.5)
    linear_default_bias_(linear)


def initialised_linear(in_features, out_features, initialise):
    """nn.Linear(in_features, out_features) that `_init_weights` initialises with `initialise(linear, config)`
    instead of xavier-uniform with a zero bias (None: that default). It stays a plain nn.Linear (`initialise` is an
    attribute), so that tools matching modules by their exact type, such as torch's `quantize_dynamic`, reach it."""
    linear = nn.Linear(in_features, out_features)
    if initialise is not None:
        linear.initialise = initialise
    return linear


class SoftmaxAttention(nn.Module):
    """Multi-head softmax attention over a memory (scaled_dot_product_attention), initialised as fairseq's
    MultiheadAttention (the reference models' encoder-decoder and RFA-doc encoder attention): q/k/v projections
    as `attention_input_linear_`, the output projection xavier-uniform with a zero bias."""

    def __init__(self, d_model, heads, dropout):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} must be divisible by the attention heads ({heads})")
        self.heads, self.dropout = heads, dropout
        self.q_proj = initialised_linear(d_model, d_model, attention_input_linear_)
        self.k_proj = initialised_linear(d_model, d_model, attention_input_linear_)
        self.v_proj = initialised_linear(d_model, d_model, attention_input_linear_)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split(self, x):  # (B, T, C) -> (B, H, T, C/H)
        return x.view(*x.shape[:2], self.heads, -1).transpose(1, 2)

    def project_memory(self, memory):
        """memory: (B, S, C) -> keys, values: (B, H, S, C/H)."""
        return self._split(self.k_proj(memory)), self._split(self.v_proj(memory))

    def attend(self, x, keys, values, key_mask=None):
        """x: (B, T, C) queries; keys/values: (B, H, S, C/H); key_mask: (B, S), 1 = attend -> (B, T, C)."""
        mask = None if key_mask is None else key_mask.bool()[:, None, None, :]
        out = F.scaled_dot_product_attention(
            self._split(self.q_proj(x)), keys, values, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )
        return self.out_proj(out.transpose(1, 2).reshape(x.shape))


class SoftmaxSelfAttention(SoftmaxAttention):
    """Non-causal self-attention, used as the mixer of softmax-attention encoders (the RFA-doc encoder)."""

    def forward(self, x, attention_mask=None, cache=None, separators=None):
        keys, values = self.project_memory(x)
        return self.attend(x, keys, values, attention_mask)


class SoftmaxCrossAttention(SoftmaxAttention):
    """Decoder cross-attention; with a cache, the encoder keys/values are computed once per source."""

    def forward(self, x, encoder_hidden_states, encoder_attention_mask=None, cache=None):
        if cache is not None and cache.keys is not None:
            keys, values = cache.keys, cache.values
        else:
            keys, values = self.project_memory(encoder_hidden_states)
            if cache is not None:
                keys, values = cache.store_source(keys, values)
        return self.attend(x, keys, values, encoder_attention_mask)


def residual(x, norm, sublayer, normalize_before, dropout, training):
    """Pre-norm: x + dropout(sublayer(norm(x))); post-norm: norm(x + dropout(sublayer(x)))."""
    h = sublayer(norm(x) if normalize_before else x)
    x = x + F.dropout(h, p=dropout, training=training)
    return x if normalize_before else norm(x)


class EncoderLayer(GradientCheckpointingLayer):
    """Token mixer then feed-forward, each in a residual block (pre- or post-norm)."""

    def __init__(self, d_model, mixer, ffn, normalize_before, dropout):
        super().__init__()
        self.mixer, self.ffn = mixer, ffn
        self.mixer_layer_norm = nn.LayerNorm(d_model)
        self.final_layer_norm = nn.LayerNorm(d_model)
        self.normalize_before, self.dropout = normalize_before, dropout

    def forward(self, hidden_states, attention_mask=None):
        args = (self.normalize_before, self.dropout, self.training)
        x = residual(hidden_states, self.mixer_layer_norm, lambda h: self.mixer(h, attention_mask), *args)
        return residual(x, self.final_layer_norm, self.ffn, *args)


class DecoderLayer(GradientCheckpointingLayer):
    """Causal token mixer, optional cross-attention, feed-forward; each in a residual block."""

    def __init__(self, d_model, mixer, cross_attention, ffn, normalize_before, dropout):
        super().__init__()
        self.mixer, self.cross_attention, self.ffn = mixer, cross_attention, ffn
        self.mixer_layer_norm = nn.LayerNorm(d_model)
        self.cross_attention_layer_norm = nn.LayerNorm(d_model) if cross_attention is not None else None
        self.final_layer_norm = nn.LayerNorm(d_model)
        self.normalize_before, self.dropout = normalize_before, dropout

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        cache=None,
        cross_cache=None,
        separators=None,
    ):
        """cache / cross_cache: this layer's RecurrentLayer of the decoder's own state / of the cross-attention
        side, when decoding with a cache."""
        args = (self.normalize_before, self.dropout, self.training)

        def mix(h):
            return self.mixer(h, attention_mask, cache, separators)

        x = residual(hidden_states, self.mixer_layer_norm, mix, *args)
        if self.cross_attention is not None:

            def cross(h):  # rows that share a source attend to it as one row of queries (see shared_sources)
                out = self.cross_attention(
                    h.reshape(encoder_hidden_states.shape[0], -1, h.shape[-1]), encoder_hidden_states,
                    encoder_attention_mask, cross_cache,
                )
                return out.reshape(h.shape)

            x = residual(x, self.cross_attention_layer_norm, cross, *args)
        return residual(x, self.final_layer_norm, self.ffn, *args)


# ---------------------------------------------------------------------------------------------------------------
# Stacks


def shared_sources(cross_caches, encoder_hidden_states, encoder_attention_mask, hooked=lambda: False):
    """The distinct sources of a decoding batch: generate() repeats each source once per beam (and per returned
    sequence), and the cross-attention of those rows is one source's, so it is prepared once per source and each
    step reads it once for all of that source's rows, as a row of k queries (beam 4: a quarter of the source
    states read per step). Found when the cross-attention side of the cache is first filled, from rows that are equal
    (`rows_per_source`), and kept in each layer's cache (`RecurrentLayer.rows_per_source`); without a cache, when
    the encoder states need gradients, or when `hooked()` (a hook sits on a cross-attention module, which can make
    it a function of the row: peft's per-row adapters, `generate(adapter_names=...)`), every row keeps its own.

    cross_caches: the layers' cross-attention RecurrentLayers (Nones without a cache); encoder_hidden_states:
    (B, S, C); encoder_attention_mask: (B, S) or None -> the states (B / k, S, C) and mask (B / k, S) of every k-th
    row, k consecutive rows sharing each. Under torch.export every row keeps its own: comparing rows is control flow
    on the data, which one exported graph cannot hold (torch.compile breaks the graph there and compares eagerly,
    so a compiled forward shares sources as an eager one does; with fullgraph=True it cannot fill a cache).
    """
    if cross_caches[0] is None:
        return encoder_hidden_states, encoder_attention_mask
    if not cross_caches[0].has_source():
        own_rows = needs_grad(encoder_hidden_states) or torch.compiler.is_exporting() or hooked()
        rows = 1 if own_rows else rows_per_source(encoder_hidden_states, encoder_attention_mask)
        for layer_cache in cross_caches:
            layer_cache.rows_per_source = rows
    rows = cross_caches[0].rows_per_source
    if rows == 1:
        return encoder_hidden_states, encoder_attention_mask
    if encoder_hidden_states.shape[0] % rows:
        raise ValueError(
            f"the cache holds sources shared by {rows} rows each, but the encoder states have "
            f"{encoder_hidden_states.shape[0]} rows: reset the cache's cross-attention side for a new batch"
        )
    mask = None if encoder_attention_mask is None else encoder_attention_mask[::rows]
    return encoder_hidden_states[::rows], mask


def rows_per_source(encoder_hidden_states, encoder_attention_mask=None):
    """The largest k such that the rows come in consecutive groups of k equal rows (equal states and mask), as
    generate() lays out the beams of each source; 1 when they do not.

    encoder_hidden_states: (B, S, C); encoder_attention_mask: (B, S) or None -> k, a divisor of B.
    """
    batch = encoder_hidden_states.shape[0]
    rows = ([encoder_hidden_states] if encoder_attention_mask is None else
            [encoder_hidden_states, encoder_attention_mask])
    run = 1  # rows equal to row 0: every group of equal rows that starts there lies within it
    while run < batch and all(torch.equal(t[run], t[0]) for t in rows):
        run += 1
    for k in range(run, 1, -1):
        if run % k == 0 and batch % k == 0 and all(_equal_in_groups(t, k) for t in rows):
            return k
    return 1


def _equal_in_groups(t, k):
    """Whether each group of k consecutive rows of t (B, ...) holds k equal rows."""
    groups = t.reshape(t.shape[0] // k, k, -1)
    return bool((groups == groups[:, :1]).all())


class TokenEmbedding(nn.Module):
    """Scaled token embeddings plus sinusoidal positions, then dropout. position_offset is added to every position
    before its sinusoid is taken (0: the first token is position 0)."""

    def __init__(self, embed_tokens, d_model, scale_embedding, dropout, position_offset=0):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.scale = math.sqrt(d_model) if scale_embedding else 1.0
        self.dropout = dropout
        self.position_offset = position_offset

    def forward(self, input_ids, inputs_embeds, positions):
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if self.position_offset:
            positions = positions + self.position_offset
        x = x * self.scale + sinusoidal_positions(positions, x.shape[-1]).to(x.dtype)
        return F.dropout(x, p=self.dropout, training=self.training)


def _check_inputs(input_ids, inputs_embeds, prefix=""):
    """The one of input_ids and inputs_embeds given, holding at least one token; prefix: "decoder_" for an
    encoder-decoder's decoder, whose arguments the errors name."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(f"pass exactly one of {prefix}input_ids and {prefix}inputs_embeds")
    ids = input_ids is not None
    name, ref = (f"{prefix}input_ids", input_ids) if ids else (f"{prefix}inputs_embeds", inputs_embeds)
    if ref.dim() != (2 if ids else 3):
        raise ValueError(f"{name} must be batched, ({'B, T' if ids else 'B, T, C'}), got shape {tuple(ref.shape)}")
    if ref.shape[1] == 0:
        raise ValueError(f"{name} holds no tokens (shape {tuple(ref.shape)}): each row needs at least one")
    return ref


def _check_padding_mask(name, mask, batch, length, at_least=False):
    """mask: None, or a (batch, length) padding mask, 1 for real tokens (at_least: (batch, >= length), the decoder
    reading its last columns); anything else (a 4D attention mask, another batch size) is rejected, not misread."""
    if mask is None:
        return
    short = mask.shape[-1] < length if at_least else mask.shape[-1] != length
    if mask.dim() != 2 or mask.shape[0] != batch or short:
        want = f"({batch}, {'>= ' if at_least else ''}{length})"
        raise ValueError(
            f"{name} must be a {want} padding mask (1 for real tokens, 0 for padding), got shape {tuple(mask.shape)}; "
            "talk_hf models take no 4D attention masks (their mixers are causal or bidirectional by construction)"
        )


def _checked_separators(separators, batch, length):
    """decoder_separators as the gate reads them: (batch, length) bool; a 0/1 mask of another dtype (as collators
    make) is taken as one, any other shape or value is a ValueError naming it."""
    if not isinstance(separators, torch.Tensor) or tuple(separators.shape) != (batch, length):
        shape = tuple(separators.shape) if isinstance(separators, torch.Tensor) else type(separators).__name__
        raise ValueError(f"decoder_separators must be a ({batch}, {length}) mask of the decoder inputs' separator "
                         f"positions (True or 1 at a separator), got {shape}")
    if separators.dtype == torch.bool:
        return separators
    if not torch.compiler.is_compiling() and not ((separators == 0) | (separators == 1)).all():
        raise ValueError("decoder_separators must hold 0 and 1 only (or be bool)")
    return separators != 0


class EncoderStack(nn.Module):
    """Embeddings, encoder layers, final norm (pre-norm only). Padding on either side does not change the
    outputs of real tokens: positions count real tokens and every mixer ignores padded positions."""

    def __init__(self, embed_tokens, layers, d_model, scale_embedding, dropout, normalize_before, position_offset=0):
        super().__init__()
        self.embed = TokenEmbedding(embed_tokens, d_model, scale_embedding, dropout, position_offset)
        self.layers = nn.ModuleList(layers)
        self.layer_norm = nn.LayerNorm(d_model) if normalize_before else None

    @property
    def embed_tokens(self):
        return self.embed.embed_tokens

    def forward(self, input_ids=None, attention_mask=None, inputs_embeds=None, output_hidden_states=None, **kwargs):
        """input_ids: (B, S) or inputs_embeds: (B, S, C); attention_mask: (B, S) -> BaseModelOutput (B, S, C)."""
        ref = _check_inputs(input_ids, inputs_embeds)
        _check_padding_mask("attention_mask", attention_mask, ref.shape[0], ref.shape[1])
        if attention_mask is None:
            attention_mask = torch.ones(ref.shape[:2], dtype=torch.long, device=ref.device)
        x = self.embed(input_ids, inputs_embeds, positions_from_mask(attention_mask, ref.shape[1]))
        hidden = [x] if output_hidden_states else None
        for layer in self.layers:
            x = layer(x, attention_mask=attention_mask)
            if hidden is not None:
                hidden.append(x)
        x = final_norm(self.layer_norm, x, hidden)
        return BaseModelOutput(last_hidden_state=x, hidden_states=tuple(hidden) if hidden else None)


def final_norm(layer_norm, x, hidden):
    """A stack's output after its final norm (if any); the last of the collected hidden states (`hidden`, a list or
    None) is that output, as transformers' models return it (hidden_states[-1] == last_hidden_state)."""
    if layer_norm is None:
        return x
    x = layer_norm(x)
    if hidden is not None:
        hidden[-1] = x
    return x


class DecoderStack(nn.Module):
    """Embeddings, causal decoder layers, optional final norm; with use_cache, its state in a transformers cache
    (a DynamicCache of RecurrentLayers, an EncoderDecoderCache with cross-attention)."""

    def __init__(
        self, embed_tokens, layers, d_model, scale_embedding, dropout, final_layer_norm, separator_config=None,
        position_offset=0,
    ):
        """separator_config: the model's config, whose `sep_token_id` marks the sentence separators, for a decoder
        with a sentential gate (None: none). The id is read at every forward, so the model gates at the id the config
        object it was built with holds, the one `save_pretrained` writes (a config object put in its place later is
        not read)."""
        super().__init__()
        self.embed = TokenEmbedding(embed_tokens, d_model, scale_embedding, dropout, position_offset)
        self.layers = nn.ModuleList(layers)
        self.layer_norm = nn.LayerNorm(d_model) if final_layer_norm else None
        self.separator_config = separator_config

    @property
    def sep_token_id(self):
        """The sentence separator's id (None: this decoder has no sentential gate)."""
        if self.separator_config is None:
            return None
        if self.separator_config.sep_token_id is None:
            raise ValueError("this decoder's sentential gate fires at config.sep_token_id, which is None: set it to "
                             "the sentence separator's id")
        return self.separator_config.sep_token_id

    @property
    def embed_tokens(self):
        return self.embed.embed_tokens

    def _cross_attention_hooked(self):
        """Whether a forward hook or pre-hook sits on a cross-attention module or a module inside one."""
        return any(module._forward_pre_hooks or module._forward_hooks
                   for layer in self.layers if layer.cross_attention is not None
                   for module in layer.cross_attention.modules())

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        cache=None,
        use_cache=False,
        inputs_embeds=None,
        position_ids=None,
        output_hidden_states=None,
        separators=None,
        **kwargs,
    ):
        """input_ids: (B, T) new tokens (or inputs_embeds (B, T, C)); attention_mask: (B, T_past + T) for
        left-padded prompts, or None; with a cache only its last T columns are read (the cache counts the real tokens
        before them), so (B, T) will do, and without one it is (B, T); encoder states (B, S, C); separators: (B, T)
        bool sentence-separator positions, read from input_ids when given (a decoder with `sep_token_id` needs one of
        the two) -> BaseModelOutputWithPast (B, T, C)."""
        # named as the encoder-decoder models take them (the source's mask is their attention_mask)
        seq2seq = encoder_hidden_states is not None
        ref = _check_inputs(input_ids, inputs_embeds, "decoder_" if seq2seq else "")
        length = ref.shape[1]
        name = "decoder_attention_mask" if seq2seq else "attention_mask"
        _check_padding_mask(name, attention_mask, ref.shape[0], length, at_least=True)
        if seq2seq:
            _check_padding_mask("attention_mask", encoder_attention_mask, *encoder_hidden_states.shape[:2])
            if encoder_hidden_states.shape[0] != ref.shape[0]:
                raise ValueError(
                    f"the encoder states have {encoder_hidden_states.shape[0]} rows and the decoder inputs "
                    f"{ref.shape[0]}: each decoder row needs its own source row"
                )
        use_cache, cache = self._cache_in_use(use_cache, cache)
        cache = decoder_cache(cache, seq2seq) if use_cache else None
        if cache is None and attention_mask is not None and attention_mask.shape[-1] != length:
            raise ValueError(
                f"{name} has {attention_mask.shape[-1]} columns for {length} tokens and there is no cache: columns "
                f"before the inputs' own belong to tokens a cache holds; pass the inputs' mask, ({ref.shape[0]}, "
                f"{length})"
            )
        states, cross_states = self._layer_caches(cache)
        if seq2seq:
            encoder_hidden_states, encoder_attention_mask = shared_sources(
                cross_states, encoder_hidden_states, encoder_attention_mask, self._cross_attention_hooked
            )
        mask = attention_mask[:, -length:] if attention_mask is not None else None
        if cache is not None:
            states[0].start_counting(ref.shape[0], ref.device)  # refuses a cache of another batch size by name
        if position_ids is None:
            if cache is not None:  # the cache counts each row's real tokens: only the new tokens' mask is read
                position_ids = states[0].positions(mask, ref.shape[0], length, ref.device)
            elif attention_mask is not None:
                position_ids = positions_from_mask(attention_mask, length)
            else:
                position_ids = torch.arange(length, device=ref.device).expand(ref.shape[0], -1)
        sep_token_id = self.sep_token_id
        if sep_token_id is None:
            separators = None
        elif input_ids is not None:
            separators = input_ids == sep_token_id
        elif separators is None:
            raise ValueError(
                "this decoder's sentential gate finds the sentence separators in its token ids: with "
                "decoder_inputs_embeds, pass decoder_separators too ((B, T) bool, True at separator positions)"
            )
        else:
            separators = _checked_separators(separators, ref.shape[0], length)
        x = self.embed(input_ids, inputs_embeds, position_ids)
        hidden = [x] if output_hidden_states else None
        for layer, state, cross_state in zip(self.layers, states, cross_states):
            # tensors that may need gradients go positionally: reentrant checkpointing sees only those
            x = layer(
                x, mask, encoder_hidden_states, encoder_attention_mask,
                cache=state, cross_cache=cross_state, separators=separators,
            )
            if hidden is not None:
                hidden.append(x)
            if state is not None:
                state.advance(mask, ref.shape[0], length, ref.device)
        x = final_norm(self.layer_norm, x, hidden)
        return BaseModelOutputWithPast(
            last_hidden_state=x, hidden_states=tuple(hidden) if hidden else None, **cache_output(cache)
        )

    def _cache_in_use(self, use_cache, cache):
        """-> (use_cache, cache) as this forward decodes. A cache passed in is read and advanced whatever use_cache
        says (as transformers' models do: use_cache=False only means that none is made); under gradient
        checkpointing no cache is used (the backward pass recomputes each layer, which would read the state its
        first pass wrote): an empty one passed in stays empty, and one that holds tokens is refused rather than
        left unread."""
        checkpointing = self.training and any(layer.gradient_checkpointing for layer in self.layers)
        if not (checkpointing and torch.is_grad_enabled()):
            return use_cache or cache is not None, cache
        if cache is not None and cache.get_seq_length() > 0:
            raise ValueError("gradient checkpointing cannot continue from a cache that holds tokens (the backward "
                             "pass recomputes each layer from the state its first pass wrote): pass the whole "
                             "sequence without a cache, or call model.gradient_checkpointing_disable()")
        if use_cache:
            logger.warning_once("use_cache=True is incompatible with gradient checkpointing: decoding without a cache")
        return False, None

    def _layer_caches(self, cache):
        """Each layer's RecurrentLayer of the decoder's own state and of the cross-attention side (Nones where
        there is no cache / no cross-attention) -> two lists of len(self.layers)."""
        n = len(self.layers)
        if cache is None:
            return [None] * n, [None] * n
        if isinstance(cache, EncoderDecoderCache):
            return recurrent_layers(cache.self_attention_cache, n), recurrent_layers(cache.cross_attention_cache, n)
        return recurrent_layers(cache, n), [None] * n


# ---------------------------------------------------------------------------------------------------------------
# Pre-trained model plumbing shared by the three families


class RecurrentPreTrainedModel(PreTrainedModel):
    """Settings every talk_hf model shares: a decoding state that cannot be rolled back (no assisted decoding)."""

    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True  # the softmax attentions call F.scaled_dot_product_attention (SoftmaxAttention.attend)
    _no_split_modules = ["EncoderLayer", "DecoderLayer"]
    _skip_keys_device_placement = ["cache", "past_key_values"]
    _is_stateful = True  # the state cannot be rolled back: assisted decoding is refused
    accepts_loss_kwargs = True  # the losses take Trainer's num_items_in_batch: accumulation sums over all tokens

    def __init__(self, config, *args, **kwargs):
        # the config's own checks run when it is built, not when a field is set afterwards (`config.conv_type =
        # "Dynamic"` would build LightConv layers): a model checks the config it is given, all but the range of the
        # special token ids other than pad_token_id, the embeddings' padding row (the others are data, read by
        # generation; a model builds with any, as transformers' models do)
        config.check_fields(token_ids=False)
        config.check_padding_token_id()
        super().__init__(config, *args, **kwargs)

    def enable_input_require_grads(self):
        """transformers' hooks (the output of each inner PreTrainedModel's `get_input_embeddings()`, the decoder's
        embedding, requires grad) and the same hook on the encoder's token embedding, a module of its own tied to
        the decoder's by weight: with frozen embeddings and reentrant checkpointing, a stack whose embedding output
        does not require grad gives its layers no gradients."""
        super().enable_input_require_grads()
        if not self.config.is_encoder_decoder:
            return
        embedding = self.get_encoder().embed.embed_tokens
        if embedding is not self.get_input_embeddings():
            hook = embedding.register_forward_hook(lambda module, inputs, output: output.requires_grad_(True))
            self._require_grads_hooks.append(hook)

    def _get_static_cache_init_shape(self):
        """generate() asks for the (heads, head_dim) of the key/value buffers of a StaticCache it allocates before
        the first forward (chunked prefill); a RecurrentLayer's fixed-size state has none and is allocated by its
        first write: None, transformers' answer for a cache that cannot be initialised early."""
        return None

    def create_masks_for_generate(self, config=None, inputs_embeds=None, attention_mask=None, **kwargs):
        """generate() asks models with a compileable cache for their masks: the decoders need only the new tokens'
        columns of the 2D mask, whose shape then stays (B, 1) at every decoding step."""
        if attention_mask is None or attention_mask.dim() != 2:
            return attention_mask
        return attention_mask[:, -inputs_embeds.shape[1] :]

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """As PreTrainedModel.from_pretrained; a weights file that is not valid safetensors raises an OSError
        naming the checkpoint (safetensors alone reports only e.g. "header too large")."""
        from safetensors import SafetensorError

        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except SafetensorError as err:
            raise OSError(
                f"the weights of {pretrained_model_name_or_path!r} are corrupted or not a safetensors file ({err}); "
                "re-download or re-upload model.safetensors"
            ) from err

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        """transformers' resize, with `mean_resizing` kept on the base model for the untied embeddings its
        `set_input_embeddings` resizes beside the decoder's (transformers hands that method the new embedding only)."""
        base = self.base_model
        base._mean_resizing = mean_resizing
        try:
            return super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        finally:
            del base._mean_resizing

    def _init_weights(self, module):
        """fairseq initialisation: N(0, d^-1/2) embeddings with a zero pad row, xavier-uniform linears, zero biases;
        a module of one family that is initialised otherwise does it in its own `init_parameters(config)`, a Linear
        layer in its `initialise(linear, config)` (`initialised_linear`); all with transformers' `initialization`
        functions, which leave loaded weights alone."""
        from transformers import initialization as init

        if hasattr(module, "init_parameters"):
            module.init_parameters(self.config)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=module.embedding_dim**-0.5)
            if module.padding_idx is not None:
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.Linear) and hasattr(module, "initialise"):
            module.initialise(module, self.config)
        elif isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)


def refuse_attention_weights(config, kwargs):
    """The talk_hf models have no attention weights to return (their token mixers are convolutions and a linear
    recurrence; their softmax attention runs fused): output_attentions=True, as a keyword or in the config, is an
    error rather than ignored."""
    asked = kwargs.get("output_attentions")
    if asked or (asked is None and getattr(config, "output_attentions", False)):
        raise ValueError(
            "talk_hf models return no attention weights (output_attentions=True): their token mixers are "
            "convolutions or a linear recurrence; pass output_attentions=False (config.output_attentions too)"
        )


def language_model_loss(logits, labels, num_items_in_batch=None, ignore_index=-100, **kwargs):
    """Cross-entropy over the positions whose label is not `ignore_index`, the labels taken as they stand (a
    seq2seq decoder's inputs are the labels shifted right): their mean, or their sum over `num_items_in_batch`
    (Trainer's count of labels over every micro-batch of a gradient-accumulation step, so that accumulating equals
    one large batch). transformers' ForMaskedLMLoss; logits (B, T, V), labels (B, T) -> scalar."""
    return ForMaskedLMLoss(logits, labels, logits.shape[-1], num_items_in_batch=num_items_in_batch,
                           ignore_index=ignore_index)


def token_embedding(config):
    """The (tied) token embedding of a model: (vocab_size, d_model) with a zero-initialised pad row."""
    return nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)


class RecurrentSeq2SeqModel(RecurrentPreTrainedModel):
    """Encoder-decoder base model: `shared`, `encoder` and `decoder` (each stack with its own embedding, tied
    through _tied_weights_keys). A family gives its layers: `encoder_layer(config, i)`, `decoder_layer(config, i)`,
    and `gates_at_separators(config)` for a decoder whose sentential gate reads sentence separators.

    The config's source-side fields, as converted fairseq models set them (talk_hf/convert_fairseq.py):
    `position_offset` shifts the positions of both stacks; the encoder's token embedding has `encoder_vocab_size`
    rows (None: vocab_size) and is tied to `shared` only when `tie_encoder_embeddings` (and transformers'
    `tie_word_embeddings`)."""

    _SHARED_EMBEDDINGS = {
        "encoder.embed.embed_tokens.weight": "shared.weight",
        "decoder.embed.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config):
        super().__init__(config)
        self.shared = token_embedding(config)
        encoder_embedding = nn.Embedding(config.encoder_vocab_size or config.vocab_size, config.d_model,
                                         padding_idx=config.pad_token_id)
        self.encoder = EncoderStack(
            encoder_embedding, [self.encoder_layer(config, i) for i in range(config.encoder_layers)],
            config.d_model, config.scale_embedding, config.dropout, config.encoder_normalize_before,
            config.position_offset,
        )
        self.decoder = DecoderStack(
            token_embedding(config), [self.decoder_layer(config, i) for i in range(config.decoder_layers)],
            config.d_model, config.scale_embedding, config.dropout, config.decoder_normalize_before,
            separator_config=config if self.gates_at_separators(config) else None,
            position_offset=config.position_offset,
        )
        self.post_init()

    @property
    def _tied_weights_keys(self):
        """transformers' {tied parameter: source} map: both stacks' embeddings are `shared`, less the encoder's
        when it is the source vocabulary's own."""
        keys = dict(self._SHARED_EMBEDDINGS)
        if not self.config.tie_encoder_embeddings:
            del keys["encoder.embed.embed_tokens.weight"]
        return keys

    def encoder_layer(self, config, i):
        raise NotImplementedError(f"{type(self).__name__} must build its encoder layers (encoder_layer)")

    def decoder_layer(self, config, i):
        raise NotImplementedError(f"{type(self).__name__} must build its decoder layers (decoder_layer)")

    def gates_at_separators(self, config):
        """Whether the decoder marks the positions of `config.sep_token_id` as sentence separators (a gate)."""
        return False

    def get_input_embeddings(self):
        """The target vocabulary's embedding in use: the decoder's (its weight is `shared`'s when tied)."""
        return self.decoder.embed.embed_tokens

    def set_input_embeddings(self, value):
        """`value` becomes the decoder's embedding; when tied (`tie_word_embeddings`) it is `shared` and the encoder's
        too, where the encoder shares the vocabulary. Untied, `shared` and an encoder of the same vocabulary keep
        their own embeddings, resized to value's rows (trained rows kept, as `resize_token_embeddings` resizes; one
        tensor under two untied names would be saved once). An encoder with its own source vocabulary
        (`tie_encoder_embeddings` False) keeps its embedding, its size recorded in `encoder_vocab_size`."""
        tied, rows = self.config.tie_word_embeddings, value.num_embeddings
        self.decoder.embed.embed_tokens = value
        self.shared = value if tied else self._resized(self.shared, rows)
        encoder = self.encoder.embed.embed_tokens
        if not self.config.tie_encoder_embeddings:
            self.config.encoder_vocab_size = encoder.num_embeddings
        else:
            self.encoder.embed.embed_tokens = value if tied else self._resized(encoder, rows)

    def _resized(self, embedding, rows):
        if embedding.num_embeddings == rows:
            return embedding
        return self._get_resized_embeddings(embedding, rows, mean_resizing=getattr(self, "_mean_resizing", True))

    def get_decoder(self):
        return self.decoder

    @can_return_tuple
    @takes_cache
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        cache=None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        use_cache=None,
        output_hidden_states=None,
        return_dict=None,
        decoder_separators=None,
        **kwargs,
    ):
        """input_ids: (B, S) source; decoder_input_ids: (B, T) -> Seq2SeqModelOutput with (B, T, C) states.
        decoder_separators: (B, T) bool, with decoder_inputs_embeds, for a decoder with a sentential gate.
        use_cache and output_hidden_states default to the config's; return_dict=False (or config.return_dict=False)
        returns the output's non-None fields as a tuple."""
        refuse_attention_weights(self.config, kwargs)
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids, attention_mask, inputs_embeds, output_hidden_states)
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            use_cache=use_cache,
            inputs_embeds=decoder_inputs_embeds,
            output_hidden_states=output_hidden_states,
            separators=decoder_separators,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            **cache_output(getattr(decoder_outputs, CACHE_NAME)),
            decoder_hidden_states=decoder_outputs.hidden_states,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
        )


class RecurrentLMHead(RecurrentPreTrainedModel, GenerationMixin):
    """What both generation heads are: `model` (the family's `base_model_class`) and a (tied) output projection
    `lm_head` over its states; the embeddings are the base model's."""

    base_model_class = None

    def __init__(self, config):
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.model.set_input_embeddings(value)

    def prepare_inputs_for_generation(self, input_ids, next_sequence_length=None, **kwargs):
        """transformers' own, refusing a cache that holds every token of the prompt (`model(prompt)` cached, then
        `generate(prompt, cache=...)`): generate() has no new token to feed then, and it feeds the whole prompt
        (`input_ids[:, -0:]`), which a recurrent state would read a second time."""
        if next_sequence_length is not None and next_sequence_length <= 0:
            # an encoder-decoder's inputs_embeds are its source's; the prompt is the decoder's
            embeds = None if self.config.is_encoder_decoder else kwargs.get("inputs_embeds")
            length = (input_ids if embeds is None else embeds).shape[1]
            cached = "decoder_input_ids=prompt[:, :-1]" if self.config.is_encoder_decoder else "prompt[:, :-1]"
            raise ValueError(
                f"the cache holds {length - next_sequence_length} tokens and the prompt has {length}: no prompt token "
                f"is left for generation to read next; cache the prompt without its last token (model(..., {cached}, "
                "use_cache=True)), or give generate() tokens after the cached ones"
            )
        return super().prepare_inputs_for_generation(input_ids, next_sequence_length=next_sequence_length, **kwargs)

    # generate() accepts the keyword arguments this method's signature names (the cache's name among them, which
    # differs between transformers releases): it names those of the method it extends
    prepare_inputs_for_generation.__signature__ = inspect.signature(GenerationMixin.prepare_inputs_for_generation)

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' save_pretrained; a folder that carries its code (`_auto_class` set) also names the base
        model in its auto_map, so that AutoModel loads it with trust_remote_code=True, as it loads transformers' own
        generation models' checkpoints (the base model's class is in the same modeling file)."""
        if self._auto_class is not None:
            module = type(self.model).__module__.rsplit(".", 1)[-1]
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}),
                                    "AutoModel": f"{module}.{type(self.model).__name__}"}
        return super().save_pretrained(save_directory, *args, **kwargs)


class RecurrentSeq2SeqLM(RecurrentLMHead):
    """Encoder-decoder generation head over a RecurrentSeq2SeqModel."""

    _tied_weights_keys = {"lm_head.weight": "model.shared.weight"}

    def get_decoder(self):
        return self.model.get_decoder()

    def prepare_decoder_input_ids_from_labels(self, labels):
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def _prepare_generation_config(self, generation_config, **kwargs):
        """transformers' merge of generate()'s settings (its keyword arguments, the config passed, the model's own),
        refusing chunked prefill (`prefill_chunk_size`): transformers' chunks cut `attention_mask`, here the source's
        mask, to the decoder's length, and leave `decoder_attention_mask` whole, which the decoder would read at the
        wrong columns."""
        generation_config, model_kwargs = super()._prepare_generation_config(generation_config, **kwargs)
        if generation_config.prefill_chunk_size is not None:
            raise ValueError("prefill_chunk_size (chunked prefill) is for decoder-only models: transformers cuts the "
                             "source's attention_mask to each chunk of the decoder prompt; prefill in one piece")
        return generation_config, model_kwargs

    def _reorder_cache(self, cache, beam_idx):
        """Beam search reorders the decoder's own state only. Beams move among the hypotheses of one source, and
        generate() repeats each source's encoder output once per beam, so the cross-attention side holds one row per
        source (`shared_sources`) that all its beams read, whichever hypotheses they hold."""
        (cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache).reorder_cache(beam_idx)
        return cache

    @can_return_tuple
    @takes_cache
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        decoder_input_ids=None,
        decoder_attention_mask=None,
        encoder_outputs=None,
        cache=None,
        inputs_embeds=None,
        decoder_inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_hidden_states=None,
        return_dict=None,
        decoder_separators=None,
        **kwargs,
    ):
        """labels: (B, T), -100 ignored; decoder inputs default to labels shifted right -> Seq2SeqLMOutput. With
        labels no decoding state is built (a training or evaluation forward, as BART's)."""
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            raise ValueError(
                "pass decoder_input_ids or labels (with label smoothing, Trainer drops labels before forward: build "
                "decoder_input_ids in the collator, e.g. DataCollatorForSeq2Seq(tokenizer, model=model))"
            )
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            decoder_separators=decoder_separators,
            output_attentions=kwargs.get("output_attentions"),
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = language_model_loss(logits, labels, **kwargs) if labels is not None else None
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **cache_output(getattr(outputs, CACHE_NAME)),
            decoder_hidden_states=outputs.decoder_hidden_states,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
        )


class RecurrentCausalLMModel(RecurrentPreTrainedModel):
    """Decoder-only base model: `decoder`, a DecoderStack without cross-attention. A family gives its layers:
    `decoder_layer(config, i)`."""

    def __init__(self, config):
        super().__init__(config)
        self.decoder = DecoderStack(
            token_embedding(config), [self.decoder_layer(config, i) for i in range(config.decoder_layers)],
            config.d_model, config.scale_embedding, config.dropout, config.final_layer_norm,
        )
        self.post_init()

    def decoder_layer(self, config, i):
        raise NotImplementedError(f"{type(self).__name__} must build its decoder layers (decoder_layer)")

    def get_input_embeddings(self):
        return self.decoder.embed.embed_tokens

    def set_input_embeddings(self, value):
        self.decoder.embed.embed_tokens = value

    @property
    def embed_tokens(self):
        return self.decoder.embed.embed_tokens

    @can_return_tuple
    @takes_cache
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        use_cache=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ):
        """input_ids: (B, T); attention_mask: (B, T_past + T), left padding allowed -> (B, T, C) states.
        use_cache and output_hidden_states default to the config's."""
        refuse_attention_weights(self.config, kwargs)
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        return self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            cache=cache,
            use_cache=use_cache,
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            output_hidden_states=output_hidden_states,
        )


class RecurrentCausalLM(RecurrentLMHead):
    """Causal language model head over a RecurrentCausalLMModel."""

    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed.embed_tokens.weight"}

    def get_decoder(self):
        return self.model.decoder

    def causal_lm_loss(self, logits, labels, shift_labels=None, **kwargs):
        """transformers' causal-LM loss (`self.loss_function`, ForCausalLMLoss: labels shifted inside, or
        `shift_labels` as given; -100 ignored). With the config's label_smoothing, transformers' LabelSmoother
        instead (ForCausalLMLoss has no smoothing). Both take `ignore_index` and Trainer's `num_items_in_batch`.
        logits (B, T, V) -> scalar."""
        smoothing = self.config.label_smoothing
        if not smoothing:
            return self.loss_function(logits, labels, self.config.vocab_size, shift_labels=shift_labels, **kwargs)
        from transformers.trainer_pt_utils import LabelSmoother  # the Trainer's utilities: imported when needed

        smoother = LabelSmoother(epsilon=smoothing, ignore_index=kwargs.get("ignore_index", -100))
        logits = {"logits": logits.float()}
        batch_items = kwargs.get("num_items_in_batch")
        if shift_labels is not None:
            return smoother(logits, shift_labels, num_items_in_batch=batch_items)
        return smoother(logits, labels, shift_labels=True, num_items_in_batch=batch_items)

    @can_return_tuple
    @takes_cache
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        cache=None,
        inputs_embeds=None,
        labels=None,
        use_cache=None,
        output_hidden_states=None,
        return_dict=None,
        logits_to_keep=0,
        **kwargs,
    ):
        """labels: (B, T) (usually input_ids; shifted inside, -100 ignored), or shift_labels: (B, T) targets already
        shifted (as sequence-parallel trainers pass them) -> CausalLMOutputWithPast. logits_to_keep: the last that
        many positions' logits (0: all), or a tensor of the positions. Other keyword arguments go to the loss
        (`num_items_in_batch`, `ignore_index`)."""
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            output_attentions=kwargs.pop("output_attentions", None),
        )
        hidden = outputs.last_hidden_state
        # transformers' convention: an int keeps the last positions (0: all), a tensor names the positions kept
        hidden = hidden[:, slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None or kwargs.get("shift_labels") is not None:
            loss = self.causal_lm_loss(logits, labels, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, **cache_output(getattr(outputs, CACHE_NAME))
        )
