"""Behaviour specific to one model family."""

import pytest
import torch

from talk_hf import ops
from talk_hf.modeling_talk import TalkConvMixer
from tests.models.tiny import SEP, VOCAB, cache_of, make, source_batch


def test_rfa_gate_acts_only_after_a_separator():
    """The decay gate changes outputs only at positions after a separator; without the gate, a separator is just
    another token. Gate bias starts at gate_bias_init."""
    gated, plain = make("rfa_doc", gate_bias_init=-3.0), make("rfa_doc-nogate")
    assert all(layer.mixer.gate is not None for layer in gated.model.decoder.layers)
    assert all(layer.mixer.gate is None for layer in plain.model.decoder.layers)
    assert torch.equal(gated.model.decoder.layers[0].mixer.gate.bias, torch.full((2,), -3.0))
    src, mask = source_batch()
    dec = torch.tensor([[2, 7, 8, 9, SEP, 10, 11, 12]] * 3)
    with_gate = gated(input_ids=src, attention_mask=mask, decoder_input_ids=dec).logits
    for layer in gated.model.decoder.layers:  # a gate of exactly 1 (no decay) is the ungated model
        layer.mixer.gate.weight.data.zero_()
        layer.mixer.gate.bias.data.fill_(1e4)
    no_decay = gated(input_ids=src, attention_mask=mask, decoder_input_ids=dec).logits
    sep = 4
    torch.testing.assert_close(with_gate[:, : sep + 1], no_decay[:, : sep + 1])
    assert (with_gate[:, sep + 1 :] - no_decay[:, sep + 1 :]).abs().max() > 1e-3


def test_rfa_gate_reads_the_separator_its_config_names_as_it_saves_it(tmp_path):
    """The gate fires at the id `config.sep_token_id` holds when the model runs: a model whose config is given
    another separator computes what the saved and reloaded model computes."""
    from talk_hf import RfaDocForConditionalGeneration

    model = make("rfa_doc")
    src, mask = source_batch()
    dec = torch.tensor([[2, 7, 8, 9, 10, 11, 12]] * 3)
    before = model(input_ids=src, attention_mask=mask, decoder_input_ids=dec).logits
    model.config.sep_token_id = 9
    after = model(input_ids=src, attention_mask=mask, decoder_input_ids=dec).logits
    assert (after - before).abs().max() > 1e-3
    model.save_pretrained(tmp_path)
    reloaded = RfaDocForConditionalGeneration.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(reloaded(input_ids=src, attention_mask=mask, decoder_input_ids=dec).logits, after)
    model.config.sep_token_id = None  # the gate is on: it needs a separator
    with pytest.raises(ValueError, match="sentential gate fires at config.sep_token_id, which is None"):
        model(input_ids=src, attention_mask=mask, decoder_input_ids=dec)


def test_rfa_gate_with_embeddings_takes_the_separators_or_refuses():
    """With decoder_inputs_embeds the gate cannot see the separators: given as decoder_separators the outputs equal
    the token ids' (the gate acts); without them the model refuses instead of running ungated."""
    model = make("rfa_doc")
    src, mask = source_batch()
    dec = torch.tensor([[2, 7, 8, 9, SEP, 10, 11, 12]] * 3)
    embeds = model.get_input_embeddings()(dec)
    with torch.no_grad():
        from_ids = model(input_ids=src, attention_mask=mask, decoder_input_ids=dec).logits
        from_embeds = model(input_ids=src, attention_mask=mask, decoder_inputs_embeds=embeds,
                            decoder_separators=dec == SEP).logits
        torch.testing.assert_close(from_embeds, from_ids)
        with pytest.raises(ValueError, match="decoder_separators"):
            model(input_ids=src, attention_mask=mask, decoder_inputs_embeds=embeds)
        plain = make("rfa_doc-nogate")  # no gate: nothing to find
        plain(input_ids=src, attention_mask=mask, decoder_inputs_embeds=plain.get_input_embeddings()(dec))


def test_rfa_gate_takes_separators_as_a_mask_of_any_dtype_and_refuses_other_shapes():
    """A 0/1 int or float mask (as collators make them) is read as the bool one; a mask of another shape or with
    other values is refused by name (not a torch error from inside the gate)."""
    model = make("rfa_doc")
    src, mask = source_batch()
    dec = torch.tensor([[2, 7, 8, 9, SEP, 10, 11, 12]] * 3)
    embeds = model.get_input_embeddings()(dec)
    run = lambda separators: model(input_ids=src, attention_mask=mask, decoder_inputs_embeds=embeds,  # noqa: E731
                                   decoder_separators=separators).logits
    with torch.no_grad():
        want = run(dec == SEP)
        for dtype in (torch.long, torch.int32, torch.float32):
            torch.testing.assert_close(run((dec == SEP).to(dtype)), want, rtol=0, atol=0)
        with pytest.raises(ValueError, match=r"decoder_separators must be a \(3, 8\) mask .* got \(3, 4\)"):
            run((dec == SEP)[:, :4])
        with pytest.raises(ValueError, match="decoder_separators must hold 0 and 1 only"):
            run((dec == SEP).long() * 2)


def test_rfa_random_features_are_drawn_when_built_and_again_by_init_weights():
    """The evaluation projections hold the seeded draw as soon as the model is built, also with weight
    initialisation skipped, and a model built on the meta device gets the same values from init_weights."""
    from transformers.initialization import no_init_weights

    reference = make("rfa_doc")
    expected = {n: b for n, b in reference.named_buffers() if n.endswith("projection")}
    assert len(expected) == 4
    with no_init_weights():
        skipped = make("rfa_doc")
    with torch.device("meta"):
        meta = make("rfa_doc")
    meta.to_empty(device="cpu")
    meta.init_weights()
    for model in (skipped, meta):
        buffers = dict(model.named_buffers())
        for name, value in expected.items():
            assert torch.equal(buffers[name], value), name


@pytest.mark.parametrize("length,form", [(6, "keys"), (9, "state")])
def test_rfa_cross_source_kept_in_the_smaller_form(length, form, monkeypatch):
    """With 128 cross features (F) and d + 1 = 9 value columns, a source shorter than F (d + 1) / (F + d + 1) = 8.4
    tokens is kept as its key features and values, a longer one as the (F, d + 1) state: the cache holds that form,
    the logits equal those of the state form (up to rounding) and cached generation equals uncached."""
    import talk_hf.modeling_rfa_doc as modeling

    model = make("rfa_doc", cross_num_frequencies=64)
    src, mask = source_batch(length=length)
    dec = torch.tensor([[2, 7, 8, SEP, 9, 10]] * 3)
    with torch.no_grad():
        out = model(input_ids=src, attention_mask=mask, decoder_input_ids=dec, use_cache=True)
    cross = cache_of(out).cross_attention_cache.layers[0]
    assert (cross.keys is not None) == (form == "keys")
    assert (cross.recurrent_state() is not None) == (form == "state")
    generated = model.generate(input_ids=src, attention_mask=mask, max_new_tokens=7, min_new_tokens=7, num_beams=2)
    assert torch.equal(generated, model.generate(input_ids=src, attention_mask=mask, max_new_tokens=7,
                                                 min_new_tokens=7, num_beams=2, use_cache=False))
    def state_form_source(k, v, mask, key_scale=None):  # the state form whatever the length
        return ops.rfa_cross_state(k if key_scale is None else k * key_scale, v, mask)

    monkeypatch.setattr(modeling, "rfa_cross_source", state_form_source)
    with torch.no_grad():
        state_form = model(input_ids=src, attention_mask=mask, decoder_input_ids=dec).logits
    torch.testing.assert_close(out.logits, state_form, rtol=1e-5, atol=1e-5)


def test_rfa_decoding_advances_the_cached_state_in_place(monkeypatch):
    """A decoding step writes the new causal-attention state over the cached one (rfa_step_: same storage, never
    stored again through the cache, so no copy), and its logits equal those of the whole prefix run without a
    cache."""
    from talk_hf.recurrent_cache import RecurrentLayer

    model = make("rfa_doc")
    src, mask = source_batch()
    dec = torch.tensor([[2, 7, SEP, 8, 9]] * 3)
    with torch.no_grad():
        out = model(input_ids=src, attention_mask=mask, decoder_input_ids=dec[:, :4], use_cache=True)
        layers = cache_of(out).self_attention_cache.layers
        addresses = [layer.recurrent_state().data_ptr() for layer in layers]
        before = [layer.recurrent_state().clone() for layer in layers]
        stored, store = [], RecurrentLayer.write_recurrent_state
        monkeypatch.setattr(RecurrentLayer, "write_recurrent_state",
                            lambda self, t, *args: (stored.append(t), store(self, t, *args))[1])
        step = model(encoder_outputs=(out.encoder_last_hidden_state,), attention_mask=mask,
                     decoder_input_ids=dec[:, 4:], cache=cache_of(out), use_cache=True)
        monkeypatch.undo()
        full = model(input_ids=src, attention_mask=mask, decoder_input_ids=dec, use_cache=False).logits
    assert stored == []
    assert [layer.recurrent_state().data_ptr() for layer in layers] == addresses
    assert all(not torch.equal(layer.recurrent_state(), b) for layer, b in zip(layers, before))
    torch.testing.assert_close(step.logits[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


def test_rfa_random_features_fixed_in_eval_and_resampled_in_training():
    model = make("rfa_doc")
    features = model.model.decoder.layers[0].mixer.features
    other = model.model.decoder.layers[1].mixer.features
    assert torch.equal(features.projection, other.projection)  # one evaluation draw for every layer
    assert torch.equal(features()[0], features.projection) and features()[1] is features.tau
    model.train()
    assert not torch.equal(features()[0], features.projection)
    src, mask = source_batch()
    dec = torch.tensor([[2, 7, 8, 9]] * 3)
    torch.manual_seed(0)
    a = model(input_ids=src, attention_mask=mask, decoder_input_ids=dec).logits
    b = model(input_ids=src, attention_mask=mask, decoder_input_ids=dec).logits
    assert not torch.equal(a, b)


def test_talk_offsets_keep_pytorch_default_init():
    model = make("talk")
    mixers = [module for module in model.modules() if isinstance(module, TalkConvMixer)]
    assert len(mixers) == 4
    for offsets in (mixer.offsets for mixer in mixers):
        bound = offsets.in_features**-0.5
        for tensor in (offsets.weight, offsets.bias):
            assert tensor.abs().max() <= bound and tensor.abs().max() > 0.5 * bound
    linear1 = model.model.encoder.layers[0].mixer.linear1
    assert torch.equal(linear1.bias, torch.zeros_like(linear1.bias))  # xavier + zero bias elsewhere


def test_lightconv_has_one_kernel_per_head_and_layer():
    model = make("lightconv")
    mixers = [layer.mixer for layer in model.model.decoder.layers]
    assert [tuple(m.weight.shape) for m in mixers] == [(2, 2), (2, 5)]
    assert all(m.weight_linear is None for m in mixers)
    dynamic = make("dynamic_conv").model.decoder.layers[1].mixer
    assert dynamic.weight is None and dynamic.weight_linear.out_features == 4 * 7


def test_no_maximum_length():
    model = make("talk_lm")
    ids = torch.randint(5, VOCAB, (1, 3000))
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, 3000, VOCAB) and torch.isfinite(logits).all()


def test_talk_encoder_windows_can_be_asymmetric():
    model = make("talk")
    mixers = [layer.mixer for layer in model.model.encoder.layers]
    assert [(m.max_left, m.max_right) for m in mixers] == [(1, 3), (4, 0)]
    assert [m.max_right for m in (layer.mixer for layer in model.model.decoder.layers)] == [0, 0]
    default = make("talk-glu-prenorm")
    assert default.config.encoder_max_right_offsets == default.config.encoder_max_offsets


@pytest.mark.parametrize("name", ["dynamic_conv", "lightconv"])
def test_dropconnect_in_training_is_the_ops_with_a_drawn_seed(name):
    """In training a conv mixer hands its logits and weight_dropout to the op, which draws the seed from torch's
    generator: the output is the reference op with that seed (one mask for a LightConv kernel); eval drops nothing."""
    model = make(name, weight_dropout=0.4, input_dropout=0.0)
    mixer = model.model.encoder.layers[1].mixer
    x = torch.randn(3, 9, 16, generator=torch.Generator().manual_seed(5))
    evaluated = mixer(x)
    mixer.train()
    torch.manual_seed(3)
    trained = mixer(x)
    torch.manual_seed(3)
    seed = ops.draw_seed()
    hidden = torch.nn.functional.glu(mixer.linear1(x), dim=-1) if mixer.glu else mixer.linear1(x)
    want = mixer.linear2(ops.dynamic_conv_ref(hidden, mixer.kernels(hidden), mixer.padding_left, True, 0.4, seed))
    torch.testing.assert_close(trained, want)
    assert not torch.allclose(trained, evaluated)
    trained.sum().backward()
    weights = mixer.weight if mixer.weight is not None else mixer.weight_linear.weight
    assert weights.grad is not None and torch.isfinite(weights.grad).all() and weights.grad.abs().sum() > 0


def _uniform(weight, bound):
    """weight looks like a U(-bound, bound) draw: within the bound, reaching near it, and (a matrix) with its standard
    deviation."""
    assert weight.abs().max() <= bound * (1 + 1e-6) and weight.abs().max() > 0.8 * bound
    if weight.dim() == 2:
        torch.testing.assert_close(weight.std().item(), bound / 3**0.5, rtol=0.05, atol=0)


def test_rfa_doc_initialised_as_the_reference_modules():
    """RFA-doc's layers start as the reference's do (docs/spec.md C.8): the encoder attention as fairseq's
    MultiheadAttention, the feed-forward layers with nn.Linear's own init, the RFA projections xavier with gain
    rfa_init_scale**-0.5 and nn.Linear's biases, the cross-attention's query/output projections small normals."""
    from transformers import AutoModelForSeq2SeqLM

    from talk_hf import RfaDocConfig

    d, ffn, scale = 128, 256, 6.0
    config = RfaDocConfig(vocab_size=64, d_model=d, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=ffn,
                          decoder_ffn_dim=ffn, encoder_attention_heads=4, decoder_attention_heads=4,
                          rfa_init_scale=scale)
    torch.manual_seed(0)
    model = AutoModelForSeq2SeqLM.from_config(config)
    encoder, decoder = model.model.encoder.layers[0], model.model.decoder.layers[0]
    xavier = (6 / (2 * d)) ** 0.5
    for proj in (encoder.mixer.q_proj, encoder.mixer.k_proj, encoder.mixer.v_proj):
        _uniform(proj.weight, 2**-0.5 * xavier)
        _uniform(proj.bias, d**-0.5)
    _uniform(encoder.mixer.out_proj.weight, xavier)
    assert not encoder.mixer.out_proj.bias.any()
    for layer in (encoder, decoder):
        _uniform(layer.ffn.fc1.weight, d**-0.5)
        _uniform(layer.ffn.fc1.bias, d**-0.5)
        _uniform(layer.ffn.fc2.weight, ffn**-0.5)
        _uniform(layer.ffn.fc2.bias, ffn**-0.5)
    causal, cross = decoder.mixer, decoder.cross_attention
    for proj in (causal.q_proj, causal.k_proj, causal.v_proj, causal.out_proj, cross.k_proj, cross.v_proj):
        _uniform(proj.weight, scale**-0.5 * xavier)
        _uniform(proj.bias, d**-0.5)
    for proj in (cross.q_proj, cross.out_proj):
        torch.testing.assert_close(proj.weight.std().item(), 0.02 * scale**-0.5, rtol=0.05, atol=0)
        assert not proj.bias.any()
    assert torch.equal(causal.gate.bias, torch.full_like(causal.gate.bias, config.gate_bias_init))


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "lightconv"])
def test_conv_decoders_cross_attention_initialised_as_fairseqs(name):
    """The conv models' encoder-decoder attention starts as fairseq's MultiheadAttention in the reference models: q/k/v
    xavier-uniform with gain 2**-0.5 and nn.Linear's biases, the output projection xavier-uniform with a zero bias."""
    d = 128
    cross = make(name, d_model=d).model.decoder.layers[0].cross_attention
    xavier = (6 / (2 * d)) ** 0.5
    for proj in (cross.q_proj, cross.k_proj, cross.v_proj):
        _uniform(proj.weight, 2**-0.5 * xavier)
        _uniform(proj.bias, d**-0.5)
    _uniform(cross.out_proj.weight, xavier)
    assert not cross.out_proj.bias.any()


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc"])
def test_a_training_forward_with_labels_builds_no_decoding_state(name):
    """With labels, a forward is for training (or an eval loss): no cache, as BART and Marian, also when the collator
    passes decoder_input_ids beside them (DataCollatorForSeq2Seq(model=...), which label smoothing needs)."""
    from tests.models.tiny import target_batch

    model = make(name)
    ids, mask = source_batch()
    labels = target_batch()
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    for given in ({}, {"decoder_input_ids": decoder_input_ids}):
        out = model(input_ids=ids, attention_mask=mask, labels=labels, **given)
        assert cache_of(out) is None and out.loss is not None
    assert cache_of(model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_input_ids)) is not None


def test_an_encoder_decoder_without_decoder_inputs_names_them():
    model = make("talk", head=False)
    ids, mask = source_batch()
    with pytest.raises(ValueError, match="pass exactly one of decoder_input_ids and decoder_inputs_embeds"):
        model(input_ids=ids, attention_mask=mask)
    with pytest.raises(ValueError, match="pass exactly one of input_ids and inputs_embeds"):
        make("talk_lm", head=False)(input_ids=None)


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc", "talk_lm"])
def test_dynamic_int8_quantization_reaches_every_linear(name):
    """torch's dynamic int8 quantization (`quantize_dynamic`, which replaces modules of the exact type nn.Linear)
    converts every projection of the model, the ones with the reference code's own initialisations included, and
    the quantized model generates."""
    from torch.ao.quantization import quantize_dynamic

    model = make(name)
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    quantized = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    left = [n for n, m in quantized.named_modules() if isinstance(m, torch.nn.Linear)]
    converted = [m for m in quantized.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    assert left == [] and len(converted) == linears
    inputs = dict(input_ids=source_batch()[0][:1]) if name != "talk_lm" else dict(input_ids=torch.tensor([[5, 6, 7]]))
    assert quantized.generate(**inputs, max_new_tokens=3, do_sample=False).shape[-1] >= 3
