"""RFA-doc (Wu et al., 2022): softmax-attention encoder, random-feature-attention decoder with a sentential gate.

Porting notes (docs/spec.md §C):
- Features: phi(x) = 0.1 [sin u, cos u] (interleaved), u = W (x/(|x|+1e-3)) / tau with a learned per-head tau;
  the normaliser is clamped below at rfa_eps = 0.1; cross-attention key features are norm-rescaled.
- Random projections: the reference samples from a stored quasi-Monte-Carlo pool that we cannot redistribute; we
  draw i.i.d. Gaussian projections every training step and use one fixed draw (seeded, stored in the checkpoint,
  the same for every layer) for evaluation and decoding.
- Decay gate (the paper's RFA-sgate): at every decoder *input* token equal to sep_token_id the causal attention
  state is multiplied by sigmoid(w.x + b) per head, after that token's own output (its key keeps weight 1).
- Initialisation follows the reference's modules (docs/spec.md §C.8): the encoder's softmax attention as fairseq's
  MultiheadAttention, the feed-forward layers with nn.Linear's own initialisation (fairseq's transformer layers keep
  it), RFA projections xavier-uniform with gain rfa_init_scale**-0.5 and nn.Linear's biases, except the
  cross-attention's query and output projections: normal with std 0.02 rfa_init_scale**-0.5, zero bias.
- The training form is chunked (talk_hf/rfa.py), not a loop over sentences; decoding carries the fixed-size
  state (S, z) per layer, and the cross-attention source (its state, or for short sources its key features and
  values, whichever is smaller: `rfa_cross_source`) is computed once per source.
"""

import torch
from torch import nn

from .backend import needs_grad
from .configuration_rfa_doc import RfaDocConfig
from .modeling_base import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    RecurrentSeq2SeqLM,
    RecurrentSeq2SeqModel,
    SoftmaxSelfAttention,
    initialised_linear,
    linear_default_bias_,
    torch_default_linear_,
)
from .rfa import (
    rfa_causal,
    rfa_cross,
    rfa_cross_source,
    rfa_feature_map,
    rfa_key_norm_rescale,
    rfa_random_projection,
    rfa_step_,
)


def rfa_projection_(linear, config):
    """Initialise a projection of RFA attention (the causal attention's q/k/v/output, the cross-attention's k/v):
    xavier-uniform with gain rfa_init_scale**-0.5, nn.Linear's own bias."""
    from transformers import initialization as init

    init.xavier_uniform_(linear.weight, gain=config.rfa_init_scale**-0.5)
    linear_default_bias_(linear)


def rfa_cross_query_(linear, config):
    """Initialise the cross-attention's query or output projection: normal with std 0.02 rfa_init_scale**-0.5, zero
    bias."""
    from transformers import initialization as init

    init.normal_(linear.weight, mean=0.0, std=0.02 * config.rfa_init_scale**-0.5)
    init.zeros_(linear.bias)


def rfa_gate_(linear, config):
    """Initialise the sentential gate's projection: xavier-uniform with gain rfa_init_scale**-0.5, its bias
    gate_bias_init."""
    from transformers import initialization as init

    init.xavier_uniform_(linear.weight, gain=config.rfa_init_scale**-0.5)
    init.constant_(linear.bias, config.gate_bias_init)


class RandomFeatures(nn.Module):
    """Random projections (H, D, d) of one attention layer: a fixed evaluation draw (a persistent buffer, the
    N(0, 1) draw of `seed`, the same in every layer) and, when `resample` is on, a fresh Gaussian draw for every
    training forward; and the layer's learned per-head temperatures. Its forward hands out both for one forward
    pass of the layer: reading them there (not as attributes) lets accelerate's hooks load offloaded weights."""

    def __init__(self, heads, num_frequencies, head_dim, resample, seed):
        super().__init__()
        self.resample, self.seed = resample, seed
        self.register_buffer("projection", torch.empty(heads, num_frequencies, head_dim))
        if not self.projection.is_meta:  # a model built on the meta device draws it in _init_weights
            self.projection.copy_(self.draw())
        self.tau = nn.Parameter(torch.ones(heads))  # learned per-head temperature

    def init_parameters(self, config):
        from transformers import initialization as init

        init.copy_(self.projection, self.draw())
        init.ones_(self.tau)

    def draw(self):
        """The evaluation projection: (H, D, d) fp32 on the CPU, from `seed`."""
        return rfa_random_projection(*self.projection.shape, generator=torch.Generator().manual_seed(self.seed))

    def forward(self):
        """-> (projection (H, D, d), tau (H,)) of this forward pass: the evaluation draw, or a fresh one in a
        training forward when resampling; `rfa_feature_map(x, projection, tau)` maps (B, T, H, d) rows with them."""
        projection = torch.randn_like(self.projection) if self.training and self.resample else self.projection
        return projection, self.tau


def _heads(x, heads):  # (B, T, C) -> (B, T, H, C/H)
    return x.view(*x.shape[:2], heads, -1)


class RfaCausalAttention(nn.Module):
    """Causal random feature attention with the optional sentential decay gate. x: (B, T, C) -> (B, T, C)."""

    def __init__(self, config):
        super().__init__()
        d, self.heads, self.eps = config.d_model, config.decoder_attention_heads, config.rfa_eps
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            initialised_linear(d, d, rfa_projection_) for _ in range(4)
        )
        self.features = RandomFeatures(self.heads, config.causal_num_frequencies, d // self.heads,
                                       config.resample_random_features, config.random_feature_seed)
        self.gate = initialised_linear(d, self.heads, rfa_gate_) if config.sentential_gate == "decay" else None

    def decay(self, x, separators):
        """(B, T, H) state decay: the gate at separator positions, 1 elsewhere; None without a gate."""
        if self.gate is None or separators is None:
            return None
        gate = torch.sigmoid(self.gate(x).float())
        return torch.where(separators.unsqueeze(-1), gate, torch.ones_like(gate))

    def forward(self, x, attention_mask=None, cache=None, separators=None):
        projection, tau = self.features()
        q = rfa_feature_map(_heads(self.q_proj(x), self.heads), projection, tau)
        k = rfa_feature_map(_heads(self.k_proj(x), self.heads), projection, tau)
        if attention_mask is not None:  # padded keys contribute nothing
            k = k * attention_mask[:, :, None, None].to(k.dtype)
        v = _heads(self.v_proj(x), self.heads)
        decay = self.decay(x, separators)
        initial = cache.recurrent_state() if cache is not None else None
        if initial is not None and not needs_grad(q, k, v, decay, initial):  # decoding: the cached state in place
            out = rfa_step_(q, k, v, initial, decay, eps=self.eps)
        else:
            out, final = rfa_causal(q, k, v, decay, initial_state=initial, eps=self.eps)
            if cache is not None:
                cache.write_recurrent_state(final, handed_over=True)  # the op's new tensor
        return self.out_proj(out.reshape(x.shape))


class RfaCrossAttention(nn.Module):
    """Random feature cross-attention; the source state (S, z) is computed once per source when caching."""

    def __init__(self, config):
        super().__init__()
        d, self.heads, self.eps = config.d_model, config.decoder_attention_heads, config.rfa_eps
        self.norm_rescale = config.norm_rescale
        self.q_proj, self.out_proj = (initialised_linear(d, d, rfa_cross_query_) for _ in range(2))
        self.k_proj, self.v_proj = (initialised_linear(d, d, rfa_projection_) for _ in range(2))
        self.features = RandomFeatures(self.heads, config.cross_num_frequencies, d // self.heads,
                                       config.resample_random_features, config.random_feature_seed)

    def source(self, encoder_hidden_states, encoder_attention_mask, projection, tau):
        """(B, S, C) encoder states -> the source side of the attention (`rfa_cross_source`): the (B, H, 2D, d + 1)
        state, or for short sources the (keys, values) pair, whichever is smaller."""
        k = _heads(self.k_proj(encoder_hidden_states), self.heads)
        scale = rfa_key_norm_rescale(k, tau, encoder_attention_mask) if self.norm_rescale else None
        v = _heads(self.v_proj(encoder_hidden_states), self.heads)
        return rfa_cross_source(rfa_feature_map(k, projection, tau), v, encoder_attention_mask, key_scale=scale)

    def forward(self, x, encoder_hidden_states, encoder_attention_mask=None, cache=None):
        projection, tau = self.features()
        source = _cached_source(cache)
        if source is None:
            source = self.source(encoder_hidden_states, encoder_attention_mask, projection, tau)
            _cache_source(cache, source)
        q = rfa_feature_map(_heads(self.q_proj(x), self.heads), projection, tau)
        out = rfa_cross(q, source, eps=self.eps).to(x.dtype)
        return self.out_proj(out.reshape(x.shape))


def _cached_source(cache):
    """The cross-attention source a decoding cache layer holds (the state, or (keys, values)), or None."""
    if cache is None:
        return None
    return cache.recurrent_state() if cache.keys is None else (cache.keys, cache.values)


def _cache_source(cache, source):
    """Keep the cross-attention source in a decoding cache layer (nothing without one): the (keys, values) form as
    the layer's keys and values, the state form as its recurrent state."""
    if cache is None:
        return
    if isinstance(source, tuple):
        cache.store_source(*source)
    else:
        cache.write_recurrent_state(source, handed_over=True)  # computed for the cache alone


def _encoder_layer(config):
    mixer = SoftmaxSelfAttention(config.d_model, config.encoder_attention_heads, config.attention_dropout)
    ffn = FeedForward(config.d_model, config.encoder_ffn_dim, config.activation_function, config.activation_dropout,
                      initialise=torch_default_linear_)  # fairseq's transformer layers keep nn.Linear's initialisation
    return EncoderLayer(config.d_model, mixer, ffn, config.encoder_normalize_before, config.dropout)


def _decoder_layer(config):
    ffn = FeedForward(config.d_model, config.decoder_ffn_dim, config.activation_function, config.activation_dropout,
                      initialise=torch_default_linear_)
    return DecoderLayer(
        config.d_model, RfaCausalAttention(config), RfaCrossAttention(config), ffn,
        config.decoder_normalize_before, config.dropout,
    )


class RfaDocModel(RecurrentSeq2SeqModel):
    """Softmax-attention encoder and RFA decoder."""

    config: RfaDocConfig

    def encoder_layer(self, config, i):
        return _encoder_layer(config)

    def decoder_layer(self, config, i):
        return _decoder_layer(config)

    def gates_at_separators(self, config):
        return config.sentential_gate != "none"


class RfaDocForConditionalGeneration(RecurrentSeq2SeqLM):
    """RFA-doc encoder-decoder with a (tied) output projection, for sentence- and document-level translation."""

    config: RfaDocConfig
    base_model_class = RfaDocModel
