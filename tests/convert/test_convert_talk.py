"""The TaLK converter (talk_hf/convert_fairseq_talk.py) on checkpoints in TaLKConvolutions' exact layout: tiny
`talkconv_iwslt_de_en` (no GLU, separate dictionaries, the decoder's own output matrix `decoder.embed_out`, as fairseq
0.10 names the old-style parameters) and `talkconv_wmt_en_de_big`-style (GLU, --share-all-embeddings, pre-norm with the
final LayerNorms) state dicts, named and shaped as talkconv.py's modules name them, saved as fairseq 0.10 saves a
checkpoint. The converted model is compared, in float64, with a time-major forward written here from talkconv.py's
equations on the raw tensors, the convolution itself by the project's specification (talk_conv_ref)."""

import argparse

import pytest
import torch
import torch.nn.functional as F

from . import fairseq_layout as layout

D_MODEL, FFN, ENC_LAYERS, DEC_LAYERS = 16, 24, 3, 2
ENC_HEADS, DEC_HEADS = 2, 4
ENC_KERNELS, DEC_KERNELS = [1, 3, 7, 15], [1, 4, 9]  # longer than the layers: TaLK reads the first entries
SOURCE_WORDS, TARGET_WORDS = 20, 28  # rows: + 4 specials
TOLERANCE = 1e-6  # float64; talk_hf's sinusoids are float32 (modeling_base.py)
VARIANTS = {
    "iwslt": dict(arch="talkconv_iwslt_de_en", encoder_glu=False, decoder_glu=False,
                  share_decoder_input_output_embed=False, share_all_embeddings=False),
    "wmt-prenorm": dict(arch="talkconv_wmt_en_de_big", encoder_glu=True, decoder_glu=True,
                        share_decoder_input_output_embed=True, share_all_embeddings=True,
                        encoder_normalize_before=True, decoder_normalize_before=True),
}


def talk_args(**changes):
    """The args Namespace of a TaLKConvolutions checkpoint (its base_architecture's fields, tiny sizes)."""
    args = dict(
        task="translation", source_lang=layout.SOURCE_LANG, target_lang=layout.TARGET_LANG,
        encoder_embed_dim=D_MODEL, decoder_embed_dim=D_MODEL, encoder_conv_dim=D_MODEL, decoder_conv_dim=D_MODEL,
        encoder_ffn_embed_dim=FFN, decoder_ffn_embed_dim=FFN, encoder_layers=ENC_LAYERS, decoder_layers=DEC_LAYERS,
        encoder_attention_heads=ENC_HEADS, decoder_attention_heads=DEC_HEADS, encoder_normalize_before=False,
        decoder_normalize_before=False, encoder_learned_pos=False, decoder_learned_pos=False,
        encoder_kernel_size_list=ENC_KERNELS, decoder_kernel_size_list=DEC_KERNELS, dropout=0.3,
        attention_dropout=0.1, relu_dropout=0.0, input_dropout=0.0, weight_dropout=0.1, encoder_embed_path=None,
        decoder_embed_path=None, adaptive_softmax_cutoff=None, adaptive_softmax_dropout=0,
        no_token_positional_embeddings=False, decoder_output_dim=D_MODEL, decoder_input_dim=D_MODEL,
        max_source_positions=1024, max_target_positions=1024, left_pad_source=False,
    )
    args.update(changes)
    return argparse.Namespace(**args)


def talk_state_dict(args, seed=0):
    """A TaLKConvModel state dict: every name and shape talkconv.py registers, random values (float64)."""
    g = torch.Generator().manual_seed(seed)
    state, conv = {}, D_MODEL
    source_rows = (TARGET_WORDS if args.share_all_embeddings else SOURCE_WORDS) + 4
    state["encoder.embed_tokens.weight"] = layout.randn(g, source_rows, D_MODEL, scale=D_MODEL**-0.5)
    state["encoder.embed_positions._float_tensor"] = torch.zeros(1)
    for i in range(ENC_LAYERS):
        p = f"encoder.layers.{i}"
        layout.linear_params(state, f"{p}.linear1", 2 * conv if args.encoder_glu else conv, D_MODEL, g)
        layout.linear_params(state, f"{p}.conv.offsets", 2 * ENC_HEADS, conv, g, scale=1.0)
        layout.linear_params(state, f"{p}.linear2", D_MODEL, conv, g)
        layout.linear_params(state, f"{p}.fc1", FFN, D_MODEL, g)
        layout.linear_params(state, f"{p}.fc2", D_MODEL, FFN, g)
        layout.norm_params(state, f"{p}.layer_norms.0", D_MODEL, g)
        layout.norm_params(state, f"{p}.layer_norms.1", D_MODEL, g)
    state["encoder.version"] = torch.tensor([2.0])
    if args.encoder_normalize_before:
        layout.norm_params(state, "encoder.layer_norm", D_MODEL, g)
    state["decoder.embed_tokens.weight"] = (state["encoder.embed_tokens.weight"] if args.share_all_embeddings else
                                            layout.randn(g, TARGET_WORDS + 4, D_MODEL, scale=D_MODEL**-0.5))
    state["decoder.embed_positions._float_tensor"] = torch.zeros(1)
    for i in range(DEC_LAYERS):
        p = f"decoder.layers.{i}"
        layout.linear_params(state, f"{p}.linear1", 2 * conv if args.decoder_glu else conv, D_MODEL, g)
        layout.linear_params(state, f"{p}.conv.offsets", DEC_HEADS, conv, g, scale=1.0)
        layout.linear_params(state, f"{p}.linear2", D_MODEL, conv, g)
        layout.norm_params(state, f"{p}.conv_layer_norm", D_MODEL, g)
        for name in ("k_proj", "v_proj", "q_proj", "out_proj"):
            layout.linear_params(state, f"{p}.encoder_attn.{name}", D_MODEL, D_MODEL, g)
        layout.norm_params(state, f"{p}.encoder_attn_layer_norm", D_MODEL, g)
        layout.linear_params(state, f"{p}.fc1", FFN, D_MODEL, g)
        layout.linear_params(state, f"{p}.fc2", D_MODEL, FFN, g)
        layout.norm_params(state, f"{p}.final_layer_norm", D_MODEL, g)
    if not args.share_decoder_input_output_embed:
        state["decoder.embed_out"] = layout.randn(g, TARGET_WORDS + 4, D_MODEL, scale=D_MODEL**-0.5)
    state["decoder.version"] = torch.tensor([2.0])
    if args.decoder_normalize_before:
        layout.norm_params(state, "decoder.layer_norm", D_MODEL, g)
    return state


def write_talk_release(folder, args, state=None):
    state = talk_state_dict(args) if state is None else state
    state = {k: v.float() for k, v in state.items()}
    source_words = TARGET_WORDS if args.share_all_embeddings else SOURCE_WORDS
    return layout.write_release(folder, args, state, source_words, TARGET_WORDS), state


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """variant -> (args, raw float32 state dict, converted folder)."""
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    built = {}
    for name, changes in VARIANTS.items():
        args = talk_args(**changes)
        folder, state = write_talk_release(tmp_path_factory.mktemp(name) / "release", args)
        built[name] = (args, state, convert_fairseq_checkpoint(folder, folder.parent / "converted"))
    return built


def load(converted, dtype=torch.float64):
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(converted).eval().to(dtype)


# ---------------------------------------------------------------------------------------------------------------
# talkconv.py's equations on the raw (time-major) tensors, float64


def maybe_norm(state, name, x, normalize_before, before):
    return layout.layer_norm(state, name, x) if before == normalize_before else x


def talk_block(state, p, x, heads, max_left, max_right, glu, pads=None):
    """input projection (GLU), pads zeroed, TaLKConv (sigmoid offsets: the left H first), output projection:
    x (T, B, C) -> (T, B, C)."""
    from talk_hf.talk_conv import talk_conv_ref

    h = layout.linear(state, f"{p}.linear1", x)
    h = F.glu(h, dim=-1) if glu else h
    if pads is not None:
        h = h.masked_fill(pads.transpose(0, 1).unsqueeze(-1), 0.0)
    offsets = torch.sigmoid(layout.linear(state, f"{p}.conv.offsets", h)).transpose(0, 1)  # (B, T, H or 2H)
    right = offsets[..., heads:] if max_right else None
    out = talk_conv_ref(h.transpose(0, 1), offsets[..., :heads], right, max_left, max_right).transpose(0, 1)
    return layout.linear(state, f"{p}.linear2", out)


def swish_ffn(state, p, x):
    return layout.linear(state, f"{p}.fc2", F.silu(layout.linear(state, f"{p}.fc1", x)))


def encoder_reference(args, state, src):
    x, pads, pre = layout.embed(state, "encoder", src, D_MODEL), src.eq(layout.PAD), args.encoder_normalize_before
    for i in range(ENC_LAYERS):
        p, k = f"encoder.layers.{i}", ENC_KERNELS[i]
        h = maybe_norm(state, f"{p}.layer_norms.0", x, pre, True)
        x = maybe_norm(state, f"{p}.layer_norms.0", x + talk_block(state, p, h, ENC_HEADS, k, k, args.encoder_glu,
                                                                    pads), pre, False)
        h = maybe_norm(state, f"{p}.layer_norms.1", x, pre, True)
        x = maybe_norm(state, f"{p}.layer_norms.1", x + swish_ffn(state, p, h), pre, False)
    return layout.layer_norm(state, "encoder.layer_norm", x) if pre else x


def model_reference(args, state, src, prev_tokens):
    """TaLKConvModel on one unpadded sentence pair: logits (B, T, V)."""
    encoder_out, pre = encoder_reference(args, state, src), args.decoder_normalize_before
    x = layout.embed(state, "decoder", prev_tokens, D_MODEL)
    for i in range(DEC_LAYERS):
        p = f"decoder.layers.{i}"
        h = maybe_norm(state, f"{p}.conv_layer_norm", x, pre, True)
        x = maybe_norm(state, f"{p}.conv_layer_norm",
                       x + talk_block(state, p, h, DEC_HEADS, DEC_KERNELS[i], 0, args.decoder_glu), pre, False)
        h = maybe_norm(state, f"{p}.encoder_attn_layer_norm", x, pre, True)
        h = layout.softmax_attention(state, f"{p}.encoder_attn", h, encoder_out, None, DEC_HEADS)
        x = maybe_norm(state, f"{p}.encoder_attn_layer_norm", x + h, pre, False)
        h = maybe_norm(state, f"{p}.final_layer_norm", x, pre, True)
        x = maybe_norm(state, f"{p}.final_layer_norm", x + swish_ffn(state, p, h), pre, False)
    if pre:
        x = layout.layer_norm(state, "decoder.layer_norm", x)
    output = state["decoder.embed_tokens.weight" if args.share_decoder_input_output_embed else "decoder.embed_out"]
    return x.transpose(0, 1) @ output.double().T


def sentence_pairs(args, count=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    source_rows = (TARGET_WORDS if args.share_all_embeddings else SOURCE_WORDS) + 4
    sources, targets = [], []
    for n in range(count):
        src = torch.randint(4, source_rows, (1, 6 + 4 * n), generator=g)
        src[0, -1] = layout.EOS
        tgt = torch.randint(4, TARGET_WORDS + 4, (1, 12), generator=g)
        tgt[0, 0] = layout.EOS
        sources.append(src)
        targets.append(tgt)
    return sources, targets


# ---------------------------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("name", list(VARIANTS))
def test_encoder_equals_the_reference(releases, name):
    args, state, converted = releases[name]
    model = load(converted)
    for src in sentence_pairs(args)[0]:
        with torch.no_grad():
            result = model.model.encoder(src).last_hidden_state
        error = layout.relative_error(encoder_reference(args, state, src).transpose(0, 1), result)
        print(f"{name}, source length {src.shape[1]}: max relative error {error:.1e}")
        assert error < TOLERANCE


@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_equal_the_reference_with_padded_sources(releases, name):
    """A left-padded batch gives, for every sentence, the reference logits of that sentence alone (TaLK zeroes the
    padded conv inputs and normalises by the constant window size, so padding changes nothing)."""
    args, state, converted = releases[name]
    model = load(converted)
    sources, targets = sentence_pairs(args)
    src, prev = layout.left_padded(sources), torch.cat(targets)
    with torch.no_grad():
        result = model(input_ids=src, attention_mask=src.ne(layout.PAD).long(), decoder_input_ids=prev).logits
    for n, (s, t) in enumerate(zip(sources, targets)):
        error = layout.relative_error(model_reference(args, state, s, t)[0], result[n])
        print(f"{name}, sentence {n}: max relative logit error {error:.1e}")
        assert error < TOLERANCE


@pytest.mark.parametrize("name", list(VARIANTS))
def test_generate_follows_the_reference(releases, name):
    """generate() (greedy, incremental TaLK decoding) picks at every step the argmax of the reference's logits
    (</s> excluded, as min_new_tokens excludes it)."""
    args, state, converted = releases[name]
    model = load(converted)
    for src in sentence_pairs(args, count=2)[0]:
        with torch.no_grad():
            out = model.generate(input_ids=src, num_beams=1, max_new_tokens=10, min_new_tokens=10,
                                 forced_eos_token_id=None, suppress_tokens=None)
        logits = model_reference(args, state, src, out[:, :-1])
        assert out[0, 0] == layout.EOS and out.shape[1] == 11
        logits[..., layout.EOS] = float("-inf")  # min_new_tokens: </s> is not allowed yet
        assert torch.equal(logits[0].argmax(-1), out[0, 1:])


def test_config_holds_the_checkpoints_hyperparameters(releases):
    from transformers import AutoConfig

    for name, (args, state, converted) in releases.items():
        config = AutoConfig.from_pretrained(converted)
        assert config.encoder_max_offsets == config.encoder_max_right_offsets == ENC_KERNELS[:ENC_LAYERS]
        assert config.decoder_max_offsets == DEC_KERNELS[:DEC_LAYERS]
        assert (config.encoder_heads, config.decoder_heads, config.decoder_attention_heads) == (2, 4, 4)
        assert (config.activation_function, config.position_offset, config.offset_dropout) == ("swish", 2, 0.1)
        shared = args.share_all_embeddings
        assert (config.tie_word_embeddings, config.tie_encoder_embeddings) == (shared, shared)
        assert config.encoder_vocab_size == (TARGET_WORDS if shared else SOURCE_WORDS) + 4


@pytest.mark.parametrize("change,message", [
    (dict(arch="talkconv_lm"), "decoder-only language model"),
    (dict(encoder_learned_pos=True), "encoder_learned_pos=True is not supported"),
    (dict(decoder_conv_dim=8), "encoder_conv_dim=16 != decoder_conv_dim=8"),
    (dict(decoder_kernel_size_list=[3]), "decoder_kernel_size_list has 1 entries for 2 layers"),
    (dict(adaptive_softmax_cutoff="10,20"), "adaptive_softmax_cutoff='10,20' is not supported"),
])
def test_what_talk_hf_cannot_compute_is_refused_by_name(tmp_path, change, message):
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    args = talk_args(**{**VARIANTS["iwslt"], **change})
    folder, _ = write_talk_release(tmp_path / "release", args, talk_state_dict(talk_args(**VARIANTS["iwslt"])))
    with pytest.raises(ValueError, match=message):
        convert_fairseq_checkpoint(folder, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_unknown_parameter_is_refused_by_name(tmp_path):
    from talk_hf.convert_fairseq import convert_fairseq_checkpoint

    args = talk_args(**VARIANTS["iwslt"])
    state = talk_state_dict(args)
    state["decoder.layers.0.conv.weight_linear.weight"] = torch.zeros(3, 16)
    folder, _ = write_talk_release(tmp_path / "release", args, state)
    with pytest.raises(ValueError, match=r"no counterpart in the converted model: decoder\.layers\.0\.conv"):
        convert_fairseq_checkpoint(folder, tmp_path / "out")
