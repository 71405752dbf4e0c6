"""The RFA-doc converter (talk_hf/convert_fairseq_rfa.py) on checkpoints in rfa-doc-mt's exact layout: a tiny
`rfa_transformer_iwslt_de_en` trained as train_rfa.sh trains it (doc_translation task, --learned-tau --norm-rescale
--decay-sentential-gate, shared decoder input/output embeddings, separate source and target dictionaries), its state
dict named and shaped as rfa-doc-mt's modules name them (time-major fairseq modules, the DynamicWrapper's `.module`
levels, tau (H, 1, 1), the training pools and the (H, D, d) evaluation random matrices), saved as fairseq 0.10 saves
a checkpoint. The converted model is compared, in float64, with references computed from the raw tensors: the
layers against the project's specifications (rfa_feature_map_ref, rfa_causal_ref, rfa_cross_ref) and the whole
model against a time-major forward written here from the reference's equations."""

import argparse

import pytest
import torch
import torch.nn.functional as F

from . import fairseq_layout as layout

D_MODEL, HEADS, FFN, ENC_LAYERS, DEC_LAYERS = 16, 2, 24, 2, 2
CAUSAL_D, CROSS_D, POOL = 4, 6, 7
SOURCE_WORDS, TARGET_WORDS = 19, 27  # rows: + 4 specials + [@@SEP@@]
SEP = 4
TOLERANCE = 1e-6  # float64 throughout; talk_hf takes the gate's sigmoid in float32 (modeling_rfa_doc.py)


def rfa_args(**changes):
    """The args Namespace of an rfa-doc-mt checkpoint (train_rfa.sh's flags, tiny sizes)."""
    args = dict(
        arch="rfa_transformer_iwslt_de_en", task="doc_translation", source_lang=layout.SOURCE_LANG,
        target_lang=layout.TARGET_LANG, encoder_embed_dim=D_MODEL, decoder_embed_dim=D_MODEL,
        encoder_ffn_embed_dim=FFN, decoder_ffn_embed_dim=FFN, encoder_layers=ENC_LAYERS, decoder_layers=DEC_LAYERS,
        encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_normalize_before=False,
        decoder_normalize_before=False, encoder_learned_pos=False, decoder_learned_pos=False, activation_fn="gelu",
        dropout=0.3, attention_dropout=0.0, activation_dropout=0.0, share_decoder_input_output_embed=True,
        share_all_embeddings=False, no_token_positional_embeddings=False, adaptive_softmax_cutoff=None,
        decoder_output_dim=D_MODEL, decoder_input_dim=D_MODEL, no_scale_embedding=False, layernorm_embedding=False,
        cross_self_attention=False, no_cross_attention=False, random_matrices_path="/abs/rfa-doc-mt/random_matrices",
        causal_proj_dim=CAUSAL_D, cross_proj_dim=CROSS_D, causal_tau=1.0, cross_tau=1.0, reparam_proj=False,
        learned_tau=True, norm_rescale=True, cuda_causal_rfa=True, init_scale=6.0, random_feature="rrf",
        use_sentential_gate=False, decay_sentential_gate=True, decay_gate_bias=2.0, cuda_inference=False,
        use_sep=True, context_size=3, full_supervision=True, fp16=True, max_source_positions=1024,
        max_target_positions=1024,
    )
    args.update(changes)
    return argparse.Namespace(**args)


def rfa_state_dict(seed=0, gate=True, learned_tau=True):
    """An rfa-doc-mt model state dict: every name and shape its modules register (fairseq 0.10 Transformer with
    RFATransformerEncoder/Decoder), random values (float64; the random matrices as the pool stores them)."""
    g = torch.Generator().manual_seed(seed)
    state, d = {}, D_MODEL // HEADS
    state["encoder.version"] = torch.tensor([3.0])
    state["encoder.embed_tokens.weight"] = layout.randn(g, SOURCE_WORDS + 5, D_MODEL, scale=D_MODEL**-0.5)
    state["encoder.embed_positions._float_tensor"] = torch.zeros(1)
    for i in range(ENC_LAYERS):
        p = f"encoder.layers.{i}"
        for name in ("k_proj", "v_proj", "q_proj", "out_proj"):
            layout.linear_params(state, f"{p}.self_attn.{name}", D_MODEL, D_MODEL, g)
        layout.norm_params(state, f"{p}.self_attn_layer_norm", D_MODEL, g)
        layout.linear_params(state, f"{p}.fc1", FFN, D_MODEL, g)
        layout.linear_params(state, f"{p}.fc2", D_MODEL, FFN, g)
        layout.norm_params(state, f"{p}.final_layer_norm", D_MODEL, g)
    for i in range(DEC_LAYERS):  # the encoder's CrossAttentionProject: cross k/v and the cross tau
        p = f"encoder.cross_attention_project.layers.{i}"
        layout.linear_params(state, f"{p}.k_proj", D_MODEL, D_MODEL, g, scale=1.0)
        layout.linear_params(state, f"{p}.v_proj", D_MODEL, D_MODEL, g)
        if learned_tau:
            state[f"{p}.tau"] = 0.5 + torch.rand(HEADS, 1, 1, generator=g, dtype=torch.float64)
    state["encoder.cross_attention_project.random_matrices"] = layout.randn(g, POOL, CROSS_D, d)
    state["encoder.cross_attention_project.random_matrices_eval"] = layout.randn(g, HEADS, CROSS_D, d)
    state["decoder.version"] = torch.tensor([3.0])
    state["decoder.embed_tokens.weight"] = layout.randn(g, TARGET_WORDS + 5, D_MODEL, scale=D_MODEL**-0.5)
    state["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    for i in range(DEC_LAYERS):
        p = f"decoder.layers.{i}.module"
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            layout.linear_params(state, f"{p}.self_attn.module.{name}", D_MODEL, D_MODEL, g, scale=0.6)
        if gate:
            layout.linear_params(state, f"{p}.self_attn.module.g_proj", HEADS, D_MODEL, g)
        if learned_tau:
            state[f"{p}.self_attn.module.tau"] = 0.5 + torch.rand(HEADS, 1, 1, generator=g, dtype=torch.float64)
        layout.norm_params(state, f"{p}.self_attn_layer_norm", D_MODEL, g)
        layout.linear_params(state, f"{p}.encoder_attn.module.q_proj", D_MODEL, D_MODEL, g, scale=0.6)
        layout.linear_params(state, f"{p}.encoder_attn.module.out_proj", D_MODEL, D_MODEL, g)
        layout.norm_params(state, f"{p}.encoder_attn_layer_norm", D_MODEL, g)
        layout.linear_params(state, f"{p}.fc1", FFN, D_MODEL, g)
        layout.linear_params(state, f"{p}.fc2", D_MODEL, FFN, g)
        layout.norm_params(state, f"{p}.final_layer_norm", D_MODEL, g)
    state["decoder.random_matrices"] = layout.randn(g, POOL, CAUSAL_D, d)
    state["decoder.random_matrices_eval"] = layout.randn(g, HEADS, CAUSAL_D, d)
    state["decoder.output_projection.weight"] = state["decoder.embed_tokens.weight"]
    return state


def write_rfa_release(folder, args=None, state=None, dtype=torch.float32):
    state = rfa_state_dict() if state is None else state
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    return layout.write_release(folder, args or rfa_args(), state, SOURCE_WORDS, TARGET_WORDS), state


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """(release folder, the raw float32 state dict, converted folder)."""
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    folder, state = write_rfa_release(tmp_path_factory.mktemp("rfa") / "release")
    return folder, state, convert_fairseq_checkpoint(folder, folder.parent / "converted")


def load(converted, dtype=torch.float64):
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(converted).eval().to(dtype)


# ---------------------------------------------------------------------------------------------------------------
# The reference's equations, from the raw (time-major) tensors, float64


def features(x, matrices, tau):
    """rfa-doc-mt's rrf features: x (T, B, H, d); matrices (H, D, d) divided by tau (H, 1, 1) -> (T, B, H, 2D)."""
    w = matrices.double() / tau.double()
    u = torch.einsum("tbhd,hkd->tbhk", x / (x.norm(dim=-1, keepdim=True) + 1e-3), w)
    return 0.1 * torch.stack([torch.sin(u), torch.cos(u)], dim=-1).flatten(-2)


def causal_reference(state, p, x, prev_tokens, causal_matrices):
    """CausalAttention's incremental recurrence with the decay gate, step by step: x (T, B, C) -> (T, B, C)."""
    T, B, C = x.shape
    heads, d = HEADS, C // HEADS
    q, k, v = (layout.linear(state, f"{p}.self_attn.module.{n}", x).view(T, B, heads, d) for n in ("q_proj", "k_proj",
                                                                                                   "v_proj"))
    tau = state[f"{p}.self_attn.module.tau"]
    phi_q, phi_k = features(q, causal_matrices, tau), features(k, causal_matrices, tau)
    s = torch.zeros(B, heads, phi_q.shape[-1], d, dtype=torch.float64)
    z = torch.zeros(B, heads, phi_q.shape[-1], dtype=torch.float64)
    outs = []
    for t in range(T):
        s = s + torch.einsum("bhk,bhd->bhkd", phi_k[t], v[t])
        z = z + phi_k[t]
        qz = torch.einsum("bhk,bhk->bh", phi_q[t], z).clamp_min(0.1)
        outs.append(torch.einsum("bhk,bhkd->bhd", phi_q[t], s) / qz.unsqueeze(-1))
        g = torch.sigmoid(layout.linear(state, f"{p}.self_attn.module.g_proj", x[t]))  # (B, H)
        g = torch.where((prev_tokens[:, t] == SEP).unsqueeze(-1), g, torch.ones_like(g))
        s, z = s * g[..., None, None], z * g[..., None]
    return layout.linear(state, f"{p}.self_attn.module.out_proj", torch.stack(outs).reshape(T, B, C))


def cross_reference(state, i, x, encoder_out, cross_matrices):
    """CrossAttentionProjectLayer (norm-rescaled key features, max over the source) then CrossAttention: x (T, B, C),
    encoder_out (S, B, C), unpadded -> (T, B, C)."""
    T, B, C = x.shape
    heads, d = HEADS, C // HEADS
    e = f"encoder.cross_attention_project.layers.{i}"
    k = layout.linear(state, f"{e}.k_proj", encoder_out).view(-1, B, heads, d)
    v = layout.linear(state, f"{e}.v_proj", encoder_out).view(-1, B, heads, d)
    tau = state[f"{e}.tau"].double()
    exponent = 0.5 * (k.norm(dim=-1, keepdim=True) * d**-0.5 / tau.view(1, 1, heads, 1)) ** 2
    phi_k = features(k, cross_matrices, tau) * torch.exp(exponent - exponent.max(dim=0, keepdim=True).values)
    s, z = torch.einsum("sbhk,sbhd->bhkd", phi_k, v), phi_k.sum(0)
    p = f"decoder.layers.{i}.module.encoder_attn.module"
    phi_q = features(layout.linear(state, f"{p}.q_proj", x).view(T, B, heads, d), cross_matrices, tau)
    qz = torch.einsum("tbhk,bhk->tbh", phi_q, z).clamp_min(0.1)
    out = torch.einsum("tbhk,bhkd->tbhd", phi_q, s) / qz.unsqueeze(-1)
    return layout.linear(state, f"{p}.out_proj", out.reshape(T, B, C))


def encoder_reference(state, src):
    """fairseq's post-norm TransformerEncoder (GELU): (B, S) tokens -> (S, B, C)."""
    x, pads = layout.embed(state, "encoder", src, D_MODEL), src.eq(layout.PAD)
    for i in range(ENC_LAYERS):
        p = f"encoder.layers.{i}"
        x = layout.layer_norm(state, f"{p}.self_attn_layer_norm",
                              x + layout.softmax_attention(state, f"{p}.self_attn", x, x, pads, HEADS))
        h = layout.linear(state, f"{p}.fc2", F.gelu(layout.linear(state, f"{p}.fc1", x)))
        x = layout.layer_norm(state, f"{p}.final_layer_norm", x + h)
    return x


def model_reference(state, src, prev_tokens):
    """The whole rfa-doc-mt model, one unpadded sentence pair at a time: logits (B, T, V)."""
    causal, cross = state["decoder.random_matrices_eval"], state["encoder.cross_attention_project.random_matrices_eval"]
    encoder_out = encoder_reference(state, src)
    x = layout.embed(state, "decoder", prev_tokens, D_MODEL)
    for i in range(DEC_LAYERS):
        p = f"decoder.layers.{i}.module"
        x = layout.layer_norm(state, f"{p}.self_attn_layer_norm",
                              x + causal_reference(state, p, x, prev_tokens, causal))
        x = layout.layer_norm(state, f"{p}.encoder_attn_layer_norm",
                              x + cross_reference(state, i, x, encoder_out, cross))
        h = layout.linear(state, f"{p}.fc2", F.gelu(layout.linear(state, f"{p}.fc1", x)))
        x = layout.layer_norm(state, f"{p}.final_layer_norm", x + h)
    return x.transpose(0, 1) @ state["decoder.output_projection.weight"].double().T


def sentence_pairs(count=3, seed=1):
    """Sources of different lengths and decoder inputs (</s> first) with [@@SEP@@] inside -> two lists of (1, T)."""
    g = torch.Generator().manual_seed(seed)
    sources, targets = [], []
    for n in range(count):
        src = torch.randint(5, SOURCE_WORDS + 5, (1, 5 + 3 * n), generator=g)
        src[0, 3], src[0, -1] = SEP, layout.EOS
        tgt = torch.randint(5, TARGET_WORDS + 5, (1, 9), generator=g)
        tgt[0, 0], tgt[0, 3], tgt[0, 6] = layout.EOS, SEP, SEP
        sources.append(src)
        targets.append(tgt)
    return sources, targets


# ---------------------------------------------------------------------------------------------------------------
# Layers against the project's specifications


def test_causal_layer_matches_the_specification_from_the_raw_tensors(release):
    """Each decoder layer's mixer against rfa_feature_map_ref + rfa_causal_ref on the checkpoint's q/k/v/out, its
    tau (H, 1, 1), its g_proj (decay sigmoid(g.x) after each separator) and the stored causal matrices."""
    from talk_hf.rfa import rfa_causal_ref, rfa_feature_map_ref

    folder, state, converted = release
    model = load(converted)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 7, D_MODEL, generator=g, dtype=torch.float64)
    separators = torch.zeros(2, 7, dtype=torch.bool)
    separators[0, 2], separators[1, 4] = True, True
    for i, layer in enumerate(model.model.decoder.layers):
        p = f"decoder.layers.{i}.module.self_attn.module"
        q, k, v = (layout.linear(state, f"{p}.{n}", x).view(2, 7, HEADS, -1) for n in ("q_proj", "k_proj", "v_proj"))
        matrices, tau = state["decoder.random_matrices_eval"].double(), state[f"{p}.tau"].double().view(-1)
        gate = torch.sigmoid(layout.linear(state, f"{p}.g_proj", x))
        decay = torch.where(separators.unsqueeze(-1), gate, torch.ones_like(gate))
        out, _ = rfa_causal_ref(rfa_feature_map_ref(q, matrices, tau), rfa_feature_map_ref(k, matrices, tau), v, decay)
        reference = layout.linear(state, f"{p}.out_proj", out.reshape(2, 7, D_MODEL))
        with torch.no_grad():
            result = layer.mixer(x, separators=separators)
        error = layout.relative_error(reference, result)
        print(f"layer {i}: max relative error {error:.1e}")
        assert error < TOLERANCE


def test_cross_layer_matches_the_specification_from_the_raw_tensors(release):
    """Each decoder layer's cross-attention against rfa_cross_ref on the encoder-side k/v and tau
    (encoder.cross_attention_project.layers.N), the decoder-side q/out, the stored cross matrices and the norm
    rescaling of the keys, exp(0.5 (|k| d^-1/2 / tau)^2 - max)."""
    from talk_hf.rfa import rfa_cross_ref, rfa_feature_map_ref

    folder, state, converted = release
    model = load(converted)
    g = torch.Generator().manual_seed(4)
    x, memory = (torch.randn(2, n, D_MODEL, generator=g, dtype=torch.float64) for n in (5, 8))
    d = D_MODEL // HEADS
    for i, layer in enumerate(model.model.decoder.layers):
        e, p = f"encoder.cross_attention_project.layers.{i}", f"decoder.layers.{i}.module.encoder_attn.module"
        matrices, tau = state["encoder.cross_attention_project.random_matrices_eval"].double(), state[f"{e}.tau"]
        tau = tau.double().view(-1)
        k = layout.linear(state, f"{e}.k_proj", memory).view(2, 8, HEADS, d)
        v = layout.linear(state, f"{e}.v_proj", memory).view(2, 8, HEADS, d)
        exponent = 0.5 * (k.norm(dim=-1, keepdim=True) / d**0.5 / tau.view(1, 1, -1, 1)) ** 2
        phi_k = rfa_feature_map_ref(k, matrices, tau) * torch.exp(exponent - exponent.amax(1, keepdim=True))
        q = layout.linear(state, f"{p}.q_proj", x).view(2, 5, HEADS, d)
        out = rfa_cross_ref(rfa_feature_map_ref(q, matrices, tau), phi_k, v)
        reference = layout.linear(state, f"{p}.out_proj", out.reshape(2, 5, D_MODEL))
        with torch.no_grad():
            result = layer.cross_attention(x, memory)
        error = layout.relative_error(reference, result)
        print(f"layer {i}: max relative error {error:.1e}")
        assert error < TOLERANCE


def test_encoder_layers_match_fairseqs_transformer_encoder(release):
    folder, state, converted = release
    model = load(converted)
    sources, _ = sentence_pairs()
    for src in sources:
        with torch.no_grad():
            result = model.model.encoder(src).last_hidden_state
        error = layout.relative_error(encoder_reference(state, src).transpose(0, 1), result)
        print(f"source length {src.shape[1]}: max relative error {error:.1e}")
        assert error < TOLERANCE


# ---------------------------------------------------------------------------------------------------------------
# The whole model


def test_logits_equal_the_reference_forward_with_padded_sources(release):
    """A left-padded batch through the converted model gives, for every sentence, the logits of the reference
    forward of that sentence alone (separators in the decoder inputs: the gate acts)."""
    folder, state, converted = release
    model = load(converted)
    sources, targets = sentence_pairs()
    src, prev = layout.left_padded(sources), torch.cat(targets)
    with torch.no_grad():
        result = model(input_ids=src, attention_mask=src.ne(layout.PAD).long(), decoder_input_ids=prev).logits
    for n, (s, t) in enumerate(zip(sources, targets)):
        error = layout.relative_error(model_reference(state, s, t)[0], result[n])
        print(f"sentence {n}: max relative logit error {error:.1e}")
        assert error < TOLERANCE


def test_the_gate_is_the_checkpoints(release):
    """Without its g_proj the reference gives other logits: the comparison above sees the gate."""
    folder, state, converted = release
    sources, targets = sentence_pairs(count=1)
    ungated = dict(state)
    for i in range(DEC_LAYERS):
        ungated[f"decoder.layers.{i}.module.self_attn.module.g_proj.bias"] = torch.full((HEADS,), 50.0)
    assert layout.relative_error(model_reference(state, sources[0], targets[0]),
                                 model_reference(ungated, sources[0], targets[0])) > 1e-3


def test_stored_random_matrices_persist_through_safetensors_and_from_pretrained(release):
    """Every layer's projection buffer holds the checkpoint's evaluation matrices (causal: decoder.random_matrices_eval,
    cross: encoder.cross_attention_project.random_matrices_eval), in model.safetensors and after from_pretrained,
    not talk_hf's seeded draw."""
    folder, state, converted = release
    saved, model = layout.converted_state(converted), load(converted, torch.float32)
    for i, layer in enumerate(model.model.decoder.layers):
        for side, key in (("mixer", "decoder.random_matrices_eval"),
                          ("cross_attention", "encoder.cross_attention_project.random_matrices_eval")):
            stored = state[key].float()
            buffer = getattr(layer, side).features
            assert torch.equal(saved[f"model.decoder.layers.{i}.{side}.features.projection"], stored)
            assert torch.equal(buffer.projection, stored)
            assert not torch.allclose(buffer.draw(), stored)


def test_generate_follows_the_reference(release):
    """generate() (greedy, from AutoModelForSeq2SeqLM.from_pretrained) picks, at every step, the argmax of the
    reference forward's logits for the tokens before it (</s> excluded, as min_new_tokens excludes it)."""
    folder, state, converted = release
    model = load(converted)
    sources, _ = sentence_pairs(count=2)
    for src in sources:
        with torch.no_grad():
            out = model.generate(input_ids=src, num_beams=1, max_new_tokens=8, min_new_tokens=8,
                                     forced_eos_token_id=None, suppress_tokens=None)
        logits = model_reference(state, src, out[:, :-1])
        assert out[0, 0] == layout.EOS and out.shape[1] == 9
        logits[..., layout.EOS] = float("-inf")  # min_new_tokens: </s> is not allowed yet
        assert torch.equal(logits[0].argmax(-1), out[0, 1:])


def test_config_tokenizer_and_fp16_checkpoint(tmp_path):
    """The config holds what the args say; the tokenizer lists [@@SEP@@] at id 4 (its sep_token) and the words from
    id 5 as rfa-doc-mt's dictionary does; a float16 checkpoint (fairseq --fp16) converts to its float32 values."""
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint
    from transformers import AutoConfig, AutoTokenizer

    folder, state = write_rfa_release(tmp_path / "release", dtype=torch.float16)
    converted = convert_fairseq_checkpoint(folder, tmp_path / "converted")
    config = AutoConfig.from_pretrained(converted)
    assert (config.vocab_size, config.encoder_vocab_size) == (TARGET_WORDS + 5, SOURCE_WORDS + 5)
    assert (config.tie_word_embeddings, config.tie_encoder_embeddings, config.position_offset) == (True, False, 2)
    assert (config.causal_num_frequencies, config.cross_num_frequencies, config.sep_token_id) == (CAUSAL_D, CROSS_D, 4)
    assert (config.sentential_gate, config.gate_bias_init, config.norm_rescale) == ("decay", 2.0, True)
    assert (config.activation_function, config.rfa_init_scale) == ("gelu", 6.0)
    tokenizer = AutoTokenizer.from_pretrained(converted)
    assert tokenizer.sep_token == "[@@SEP@@]" and tokenizer.sep_token_id == SEP
    assert tokenizer("w0 w1 [@@SEP@@] w2")["input_ids"] == [5, 6, SEP, 7, layout.EOS]
    # as rfa-doc-mt's DocTranslationDictionary.string, skipping special tokens drops the separator (kept otherwise:
    # document translation splits decoded windows at it)
    assert tokenizer.decode([5, SEP, 6, layout.EOS], skip_special_tokens=True) == "w0 w1"
    assert tokenizer.decode([5, SEP, 6]) == "w0 [@@SEP@@] w1"
    saved = layout.converted_state(converted)
    assert torch.equal(saved["model.decoder.layers.1.mixer.gate.weight"],
                       state["decoder.layers.1.module.self_attn.module.g_proj.weight"].float())


def test_fixed_temperatures_and_no_gate(tmp_path):
    """Without --learned-tau the checkpoint has no tau: the converted temperatures are args.causal_tau / cross_tau;
    without a gate (and outside the doc_translation task) there is no separator."""
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint
    from transformers import AutoConfig

    args = rfa_args(learned_tau=False, causal_tau=0.7, cross_tau=1.3, decay_sentential_gate=False, task="translation")
    state = rfa_state_dict(gate=False, learned_tau=False)
    for side in ("encoder", "decoder"):  # the translation task's dictionaries have no [@@SEP@@]
        state[f"{side}.embed_tokens.weight"] = state[f"{side}.embed_tokens.weight"][:-1]
    state["decoder.output_projection.weight"] = state["decoder.embed_tokens.weight"]
    folder, _ = write_rfa_release(tmp_path / "release", args, state)
    converted = convert_fairseq_checkpoint(folder, tmp_path / "converted")
    saved = layout.converted_state(converted)
    assert torch.equal(saved["model.decoder.layers.0.mixer.features.tau"], torch.full((HEADS,), 0.7))
    assert torch.equal(saved["model.decoder.layers.1.cross_attention.features.tau"], torch.full((HEADS,), 1.3))
    config = AutoConfig.from_pretrained(converted)
    assert (config.sentential_gate, config.sep_token_id, config.vocab_size) == ("none", None, TARGET_WORDS + 4)


# ---------------------------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("change,message", [
    (dict(use_sentential_gate=True, decay_sentential_gate=False), "use_sentential_gate=True is not supported"),
    (dict(reparam_proj=True), "reparam_proj=True is not supported"),
    (dict(random_feature="prf"), "random_feature='prf' is not supported"),
    (dict(activation_fn="swish"), "activation_fn='swish' is not supported"),
    (dict(causal_proj_dim=8), r"decoder.random_matrices_eval has shape \(2, 4, 8\), expected"),
    (dict(arch="doc_translation_transformer_iwslt_de_en"), "softmax-attention baseline"),
    (dict(decay_sentential_gate=True, task="translation"), "needs the doc_translation task's separator"),
    (dict(encoder_layers_to_keep="0"), "encoder_layers_to_keep='0' is not supported: fairseq keeps only the listed"),
    (dict(decoder_layers_to_keep="0,1"), "decoder_layers_to_keep='0,1' is not supported: fairseq keeps only the"),
    (dict(decay_sentential_gate=False), "has g_proj .* but decay_sentential_gate is off"),
])
def test_what_talk_hf_cannot_compute_is_refused_by_name(tmp_path, change, message):
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    state = rfa_state_dict()
    if change.get("task") == "translation":
        for side in ("encoder", "decoder"):
            state[f"{side}.embed_tokens.weight"] = state[f"{side}.embed_tokens.weight"][:-1]
    folder, _ = write_rfa_release(tmp_path / "release", rfa_args(**change), state)
    with pytest.raises(ValueError, match=message):
        convert_fairseq_checkpoint(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_evaluation_matrices_are_refused(tmp_path):
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    state = rfa_state_dict()
    del state["encoder.cross_attention_project.random_matrices_eval"]
    folder, _ = write_rfa_release(tmp_path / "release", state=state)
    with pytest.raises(ValueError, match="no encoder.cross_attention_project.random_matrices_eval"):
        convert_fairseq_checkpoint(folder, tmp_path / "out")


def test_a_dictionary_of_another_size_is_refused_with_the_embeddings_rows(tmp_path):
    """The size check counts the separator: the message gives the embedding's rows and the one for [@@SEP@@]."""
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    folder, _ = write_rfa_release(tmp_path / "release")
    layout.write_dictionary(folder / f"dict.{layout.TARGET_LANG}.txt", TARGET_WORDS + 1)
    rows = TARGET_WORDS + 5
    message = (rf"has {rows} entries but the checkpoint's decoder embedding has {rows} rows = {rows - 1} dictionary "
               r"entries \+ \[@@SEP@@\] \(not in the file\)")
    with pytest.raises(ValueError, match=message):
        convert_fairseq_checkpoint(folder, tmp_path / "out")
