"""The decoding state lives in transformers' own cache classes: `DynamicCache` / `StaticCache` built from
`config.layer_types`, `EncoderDecoderCache` for the encoder-decoder models, each layer a `RecurrentLayer` (the library's
linear-attention layer, extended). What code written for transformers caches does with them must work: build them
from the config, read the layers' states, continue generating from a returned cache, reset and reuse."""

import copy
import importlib.util
import re

import pytest
import torch
from transformers import DynamicCache, EncoderDecoderCache, GenerationConfig, StaticCache
from transformers.cache_utils import DynamicLayer, LinearAttentionLayer

from talk_hf import modeling_base, modeling_rfa_doc, recurrent_cache
from talk_hf.modeling_base import rows_per_source
from talk_hf.recurrent_cache import LAYER_TYPE, RecurrentLayer
from talk_hf.rfa import rfa_causal, rfa_cross_source
from tests.models.test_modeling_common import inputs_for
from talk_hf.versions import CACHE_NAME
from tests.models.tiny import ALL, LM, SEQ2SEQ, VOCAB, cache_of, make, source_batch, target_batch

FAMILIES = ["talk", "dynamic_conv", "rfa_doc", "talk_lm", "dynamic_conv_lm"]


def config_cache(model, kind):
    """The cache a transformers user builds for `model`: from its config, as generate() does."""
    build = {"dynamic": lambda: DynamicCache(config=model.config),
             "static": lambda: StaticCache(config=model.config, max_cache_len=32)}[kind]
    return EncoderDecoderCache(build(), build()) if model.config.is_encoder_decoder else build()


def decoder_tokens(name):
    """-> (the model's other inputs, the name of its decoder tokens, those tokens (B, T)): decoded in steps beside the
    other inputs (an LM's prompt without its padding mask)."""
    inputs = inputs_for(name)
    key = "decoder_input_ids" if name in SEQ2SEQ else "input_ids"
    tokens = inputs.pop(key)
    if name in LM:
        inputs.pop("attention_mask")
    return inputs, key, tokens


def self_side(cache):
    return cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache


@pytest.mark.parametrize("name", list(ALL))
def test_config_names_a_recurrent_layer_per_decoder_layer(name):
    model = make(name)
    assert model.config.layer_types == [LAYER_TYPE] * model.config.decoder_layers
    for kind in ("dynamic", "static"):
        layers = self_side(config_cache(model, kind)).layers
        assert len(layers) == model.config.decoder_layers
        assert all(isinstance(layer, RecurrentLayer) and isinstance(layer, LinearAttentionLayer) for layer in layers)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_cache_passed_is_read_whatever_use_cache_says(name):
    """use_cache=False (as an argument, or in the config, as set for gradient checkpointing) means no cache is made;
    a cache passed in is still read and advanced, as transformers' models do."""
    model = make(name)
    inputs, key, tokens = decoder_tokens(name)
    with torch.no_grad():
        full = model(**inputs, **{key: tokens}, use_cache=False).logits[:, -1]
        for use_cache_setting in ({"use_cache": False}, {}):
            model.config.use_cache = not use_cache_setting
            cache = cache_of(model(**inputs, **{key: tokens[:, :-1]}, use_cache=True))
            step = model(**inputs, **{key: tokens[:, -1:]}, cache=cache, **use_cache_setting)
            assert cache_of(step) is cache
            torch.testing.assert_close(step.logits[:, -1], full, rtol=1e-5, atol=1e-5)
            assert model(**inputs, **{key: tokens[:, -1:]}, use_cache=False).logits.shape[1] == 1


@pytest.mark.parametrize("name", FAMILIES)
def test_a_cache_filled_under_inference_mode_continues_outside_it(name):
    """Serving code fills a cache under torch.inference_mode(); generate() continues it under no_grad, where the
    cache's inference tensors cannot be written in place: it decodes on as the full forward, and resets."""
    model = make(name)
    inputs, key, tokens = decoder_tokens(name)
    T = tokens.shape[1]
    with torch.no_grad():
        full = model(**inputs, **{key: tokens}, use_cache=False).logits

    def decodes_on(cache):
        with torch.no_grad():
            steps = [model(**inputs, **{key: tokens[:, i : i + 1]}, cache=cache).logits for i in (T - 2, T - 1)]
        torch.testing.assert_close(torch.cat(steps, 1), full[:, -2:], rtol=1e-5, atol=1e-5)

    with torch.inference_mode():
        cache = cache_of(model(**inputs, **{key: tokens[:, :-2]}, use_cache=True))
    decodes_on(cache)
    with torch.no_grad():
        cache.reset()
    with torch.inference_mode():
        model(**inputs, **{key: tokens[:, :-2]}, cache=cache)
    decodes_on(cache)


@pytest.mark.parametrize("name", list(LM))
def test_chunked_prefill_into_a_static_cache_generates_as_one_prefill(name):
    model = make(name)
    ids = target_batch(length=9, with_separators=False)
    settings = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)
    plain = model.generate(input_ids=ids, **settings)
    chunked = model.generate(input_ids=ids, prefill_chunk_size=4, cache_implementation="static", **settings)
    assert torch.equal(chunked, plain)


@pytest.mark.parametrize("name", list(SEQ2SEQ))
def test_chunked_prefill_of_an_encoder_decoder_model_is_refused(name):
    """transformers' chunked prefill cuts `attention_mask` (an encoder-decoder model's source mask) to the decoder's
    length and leaves `decoder_attention_mask` whole: refused, whichever way it is asked for."""
    model = make(name)
    src, mask = source_batch()
    prompt = target_batch(length=5, with_separators=False)
    prompt[:, 0] = model.config.decoder_start_token_id
    inputs = dict(input_ids=src, attention_mask=mask, decoder_input_ids=prompt, max_new_tokens=2)
    with pytest.raises(ValueError, match="prefill_chunk_size"):
        model.generate(**inputs, prefill_chunk_size=2)
    with pytest.raises(ValueError, match="prefill_chunk_size"):
        model.generate(**inputs, generation_config=GenerationConfig(prefill_chunk_size=2, max_new_tokens=2))
    model.generation_config.prefill_chunk_size = 2  # a passed config takes the settings it leaves unset from it
    with pytest.raises(ValueError, match="prefill_chunk_size"):
        model.generate(**inputs, generation_config=GenerationConfig(num_beams=1, max_new_tokens=2))


def test_a_talk_hf_model_as_a_draft_model_is_refused_by_name():
    """(As the main model it is refused too: `_is_stateful`.)"""
    from transformers import GPT2Config, GPT2LMHeadModel

    main = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2, bos_token_id=0,
                                      eos_token_id=2, pad_token_id=1)).eval()
    draft = make("talk_lm")
    ids = target_batch(length=5, with_separators=False)[:1]  # assisted generation takes one sequence
    with pytest.raises(ValueError, match="cannot be an assistant"):
        main.generate(input_ids=ids, assistant_model=draft, max_new_tokens=3)


def test_gradient_checkpointing_refuses_a_cache_that_holds_tokens():
    model = make("talk_lm")
    ids = target_batch(length=6, with_separators=False)
    with torch.no_grad():
        cache = cache_of(model(ids[:, :-1], use_cache=True))
    model.gradient_checkpointing_enable()
    model.train()
    with pytest.raises(ValueError, match="gradient checkpointing cannot continue from a cache that holds tokens"):
        model(ids[:, -1:], cache=cache)
    model(ids, labels=ids).loss.backward()  # without a cache, as training runs


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("name", FAMILIES)
def test_a_cache_built_from_the_config_decodes_as_the_full_forward(name, kind):
    """Prefix, then single tokens, through a user-built cache == one forward without a cache; the same cache
    object comes back."""
    model = make(name)
    inputs, key, tokens = decoder_tokens(name)
    with torch.no_grad():
        full = model(**inputs, **{key: tokens}, use_cache=False).logits
        cache, outs = config_cache(model, kind), []
        for start, stop in [(0, 4), (4, 5), (5, tokens.shape[1])]:
            out = model(**inputs, **{key: tokens[:, start:stop]}, cache=cache, use_cache=True)
            assert cache_of(out) is cache
            outs.append(out.logits)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)
    assert cache.get_seq_length() == tokens.shape[1]


@pytest.mark.parametrize("name,state,shape", [
    ("talk", "conv_states", lambda m, B: (B, m.config.decoder_max_offsets[0] + 2, m.config.d_model)),
    ("dynamic_conv", "conv_states", lambda m, B: (B, m.config.decoder_kernel_sizes[0] - 1, m.config.d_model)),
    ("talk_lm", "conv_states", lambda m, B: (B, m.config.decoder_max_offsets[0] + 2, m.config.d_model)),
    ("rfa_doc", "recurrent_states", lambda m, B: (B, 2, 2 * 8, 8 + 1)),
])
def test_each_layer_holds_its_fixed_size_state_where_the_library_puts_it(name, state, shape):
    """DynamicConv's and TaLK's rings are conv states, RFA's (S, z) a recurrent state; their size does not grow
    with the tokens; softmax cross-attention keeps the encoder keys/values as the cross side's keys/values."""
    model = make(name)
    inputs = inputs_for(name)
    B = next(iter(inputs.values())).shape[0]
    with torch.no_grad():
        cache = cache_of(model(**inputs, use_cache=True))
    layer = self_side(cache).layers[0]
    assert getattr(layer, state)[0].shape == shape(model, B)
    assert layer.keys is None  # nothing grows
    other = "recurrent_states" if state == "conv_states" else "conv_states"
    assert getattr(layer, other)[0] is None
    assert getattr(layer, other[:-1])() is None  # conv_state() / recurrent_state(): the kind it does not hold
    if name in ("talk", "dynamic_conv"):
        cross = cache.cross_attention_cache.layers[0]
        heads, d = model.config.decoder_attention_heads, model.config.d_model
        assert cross.keys.shape == cross.values.shape == (B, heads, inputs["input_ids"].shape[1], d // heads)


@pytest.mark.parametrize("name", ["talk_lm", "dynamic_conv_lm"])
def test_generation_continues_from_a_returned_cache(name):
    """Passing the cache of one generate() call back with the whole sequence so far (multi-turn use) continues it:
    the same tokens as one longer call, and generate() feeds only the new tokens (the cache says how many it has)."""
    model = make(name)
    prompt = target_batch(length=5, with_separators=False)
    kwargs = dict(do_sample=False, return_dict_in_generate=True)
    first = model.generate(input_ids=prompt, max_new_tokens=4, min_new_tokens=4, **kwargs)
    cache = cache_of(first)
    assert cache.get_seq_length() == first.sequences.shape[1] - 1  # the last token is not consumed yet
    more = model.generate(input_ids=first.sequences, **{CACHE_NAME: cache}, max_new_tokens=3, min_new_tokens=3,
                          **kwargs)
    at_once = model.generate(input_ids=prompt, max_new_tokens=7, min_new_tokens=7, **kwargs)
    assert torch.equal(more.sequences, at_once.sequences)


@pytest.mark.parametrize("name", ["talk_lm", "dynamic_conv_lm"])
def test_generation_continues_from_inputs_embeds_and_a_returned_cache(name):
    """The same from embeddings: the whole sequence so far as inputs_embeds, of which generate() feeds the model
    only what the cache has not consumed."""
    model = make(name)
    prompt = target_batch(length=5, with_separators=False)
    embed = model.get_input_embeddings()
    kwargs = dict(do_sample=False, return_dict_in_generate=True)

    def generate(ids, new_tokens, **more):
        return model.generate(inputs_embeds=embed(ids), attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, **kwargs, **more)

    first = generate(prompt, 3)
    so_far = torch.cat([prompt, first.sequences], 1)
    more = generate(so_far, 2, **{CACHE_NAME: cache_of(first)})
    assert torch.equal(torch.cat([first.sequences, more.sequences], 1), generate(prompt, 5).sequences)


@pytest.mark.parametrize("name", ["talk", "rfa_doc"])
def test_seq2seq_generation_continues_from_a_returned_cache(name):
    """As for any transformers encoder-decoder: the decoder mask covers the whole target so far, which tells
    generate() that the cache holds all but the last of those tokens."""
    model = make(name)
    src, mask = source_batch()
    kwargs = dict(input_ids=src, attention_mask=mask, do_sample=False, return_dict_in_generate=True)
    first = model.generate(max_new_tokens=4, min_new_tokens=4, **kwargs)
    more = model.generate(decoder_input_ids=first.sequences, decoder_attention_mask=torch.ones_like(first.sequences),
                          **{CACHE_NAME: cache_of(first)}, max_new_tokens=3, min_new_tokens=3, **kwargs)
    at_once = model.generate(max_new_tokens=7, min_new_tokens=7, **kwargs)
    assert torch.equal(more.sequences, at_once.sequences)


@pytest.mark.parametrize("name", FAMILIES)
def test_a_cache_that_holds_the_whole_prompt_is_refused_by_generate(name):
    """A prompt cached whole (`model(prompt)`) and then given to generate() with that prompt leaves generate() no
    token to feed, and it feeds the whole prompt again, which a recurrent state would read twice: refused, naming
    the remedy (cache all but the prompt's last token), which then generates as without a cache."""
    model = make(name)
    prompt = target_batch(length=5, with_separators=False)
    inputs = {}
    if name in SEQ2SEQ:
        prompt[:, 0] = model.config.decoder_start_token_id
        src, mask = source_batch(batch=prompt.shape[0])
        inputs = dict(input_ids=src, attention_mask=mask)
    key = "decoder_input_ids" if name in SEQ2SEQ else "input_ids"
    mask_key = "decoder_attention_mask" if name in SEQ2SEQ else "attention_mask"
    settings = dict(inputs, **{mask_key: torch.ones_like(prompt)}, do_sample=False, max_new_tokens=3,
                    min_new_tokens=3)
    with torch.no_grad():
        whole = cache_of(model(**inputs, **{key: prompt}, use_cache=True))
        cached = "decoder_input_ids=prompt" if name in SEQ2SEQ else "prompt"
        with pytest.raises(ValueError, match=re.escape(f"the cache holds 5 tokens and the prompt has 5: no prompt "
                                                       f"token is left for generation to read next; cache the prompt "
                                                       f"without its last token (model(..., {cached}[:, :-1]")):
            model.generate(**{key: prompt, CACHE_NAME: whole}, **settings)
        if name in SEQ2SEQ:  # the source given as embeddings: the numbers are still the decoder prompt's
            embedded = dict(settings, inputs_embeds=model.get_input_embeddings()(settings["input_ids"]))
            del embedded["input_ids"]
            with pytest.raises(ValueError, match="the cache holds 5 tokens and the prompt has 5"):
                model.generate(**{key: prompt, CACHE_NAME: copy.deepcopy(whole)}, **embedded)
        all_but_last = cache_of(model(**inputs, **{key: prompt[:, :-1]}, use_cache=True))
        cached = model.generate(**{key: prompt, CACHE_NAME: all_but_last}, **settings)
    assert torch.equal(cached, model.generate(**{key: prompt}, **settings))


@pytest.mark.parametrize("name", FAMILIES)
def test_dict_generation_outputs_with_scores_and_cache(name):
    model = make(name)
    inputs = inputs_for(name)
    inputs.pop("decoder_input_ids", None)
    out = model.generate(**inputs, max_new_tokens=3, min_new_tokens=3, return_dict_in_generate=True,
                         output_scores=True, use_cache=True)
    assert len(out.scores) == 3 and out.scores[0].shape[-1] == model.config.vocab_size
    cache = cache_of(out)
    assert isinstance(cache, EncoderDecoderCache if name in SEQ2SEQ else DynamicCache)
    assert all(isinstance(layer, RecurrentLayer) for layer in self_side(cache).layers)


@pytest.mark.parametrize("name", ["talk", "dynamic_conv_lm"])
def test_a_reset_cache_decodes_as_a_new_one(name):
    """reset() keeps every state's storage (static addresses) and forgets the tokens and the source."""
    model = make(name)
    inputs = inputs_for(name)
    with torch.no_grad():
        fresh = model(**inputs, use_cache=True)
        cache = cache_of(fresh)
        addresses = [layer.conv_state().data_ptr() for layer in self_side(cache).layers]
        cache.reset()
        assert cache.get_seq_length() == 0
        again = model(**inputs, cache=cache, use_cache=True)
    torch.testing.assert_close(again.logits, fresh.logits, rtol=0, atol=0)
    assert [layer.conv_state().data_ptr() for layer in self_side(cache).layers] == addresses


@pytest.mark.parametrize("name", ALL)
def test_a_reset_cache_takes_a_batch_of_another_size(name):
    """A cache reset after a batch of 4 decodes a batch of 3 as a new cache does (as transformers' DynamicCache
    after reset)."""
    model = make(name)
    small = {key: value[:3] for key, value in inputs_for(name).items()}
    larger = {key: torch.cat([value, value[:1]]) for key, value in inputs_for(name).items()}
    with torch.no_grad():
        cache = cache_of(model(**larger, use_cache=True))
        cache.reset()
        again = model(**small, cache=cache, use_cache=True)
        fresh = model(**small, use_cache=True)
    torch.testing.assert_close(again.logits, fresh.logits, rtol=0, atol=0)


@pytest.mark.parametrize("with_positions", [False, True], ids=["", "position_ids"])
def test_a_cache_of_another_batch_size_is_refused_by_name(with_positions):
    """With or without position_ids (generate() passes them to the LMs)."""
    model = make("talk_lm")
    ids = torch.tensor([[5, 6, 7], [7, 6, 5]])
    more = {"position_ids": torch.full((3, 1), 3)} if with_positions else {}
    with torch.no_grad():
        cache = cache_of(model(input_ids=ids, use_cache=True))
        with pytest.raises(ValueError, match="holds the decoding state of 2 sequences.*3"):
            model(input_ids=torch.tensor([[5], [6], [7]]), cache=cache, use_cache=True, **more)


def test_a_filled_cache_of_another_copy_of_the_code_continues():
    """Layers of another copy of recurrent_cache.py (remote code of a second folder or revision registers its own
    RecurrentLayer under the same layer type) holding a state are kept and continued, not replaced by empty ones."""
    spec = importlib.util.spec_from_file_location("another_copy.recurrent_cache", recurrent_cache.__file__)
    other = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(other)
    model = make("talk_lm")
    kwargs = dict(do_sample=False, return_dict_in_generate=True, output_logits=True, max_new_tokens=3)
    first = model.generate(input_ids=target_batch(length=5, with_separators=False), **kwargs)
    foreign = DynamicCache()
    for layer in cache_of(first).layers:
        copied = other.RecurrentLayer()
        copied.__dict__.update(copy.deepcopy(layer.__dict__))
        foreign.layers.append(copied)
    want = model.generate(input_ids=first.sequences, **{CACHE_NAME: cache_of(first)}, **kwargs)
    got = model.generate(input_ids=first.sequences, **{CACHE_NAME: foreign}, **kwargs)
    assert all(isinstance(layer, other.RecurrentLayer) for layer in foreign.layers)
    for a, b in zip(got.logits, want.logits):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_an_attention_model_given_a_talk_hf_cache_is_refused_by_name():
    """A talk_hf cache layer holds a recurrent state, not a growing key/value cache: an attention model given one
    (a cache built from a talk_hf config, or returned by a talk_hf model) fails saying so, not with wrong logits."""
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2)).eval()
    with pytest.raises(ValueError, match="recurrent decoding state.*DynamicCache"):
        gpt2(input_ids=torch.tensor([[5, 6, 7]]), past_key_values=DynamicCache(config=make("talk_lm").config))


def test_a_handed_over_state_is_stored_without_a_copy():
    """A first write keeps a copy of what the caller passed (it may hold views of it), unless the caller hands the
    tensor over; a handed-over non-contiguous state is stored contiguous; later writes go in place either way."""
    given = torch.randn(2, 3, 4, 5)
    kept, handed = RecurrentLayer(), RecurrentLayer()
    copy = kept.write_recurrent_state(given)
    assert copy.data_ptr() != given.data_ptr() and torch.equal(copy, given)
    assert handed.write_recurrent_state(given, handed_over=True) is given
    later = torch.randn(2, 3, 4, 5)
    assert handed.write_recurrent_state(later, handed_over=True) is given and torch.equal(given, later)
    strided = RecurrentLayer().write_recurrent_state(later.transpose(1, 2), handed_over=True)
    assert strided.is_contiguous() and torch.equal(strided, later.transpose(1, 2))


def test_rfa_doc_keeps_the_states_it_computes_without_copying_them(monkeypatch):
    """RFA-doc hands its new states to the cache (a first write of tens of MB per layer at the paper's batch sizes):
    the cache holds the very tensors the ops returned, each layer's causal state and its source."""
    finals, sources = [], []

    def causal(*args, **kwargs):
        out, final = rfa_causal(*args, **kwargs)
        finals.append(final)
        return out, final

    def source(*args, **kwargs):
        sources.append(rfa_cross_source(*args, **kwargs))
        return sources[-1]

    monkeypatch.setattr(modeling_rfa_doc, "rfa_causal", causal)
    monkeypatch.setattr(modeling_rfa_doc, "rfa_cross_source", source)
    model = make("rfa_doc")
    with torch.no_grad():
        cache = cache_of(model(**inputs_for("rfa_doc"), use_cache=True))
    layers = cache.self_attention_cache.layers
    assert len(finals) == len(sources) == len(layers) > 0
    assert all(layer.recurrent_state() is final for layer, final in zip(layers, finals, strict=True))
    for layer, held in zip(cache.cross_attention_cache.layers, sources, strict=True):
        assert layer.recurrent_state() is held if torch.is_tensor(held) else layer.keys is held[0]


def test_an_empty_cache_without_config_is_filled():
    model = make("dynamic_conv")
    inputs = inputs_for("dynamic_conv")
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    with torch.no_grad():
        out = model(**inputs, cache=cache, use_cache=True)
        lone = model(**inputs, cache=DynamicCache(), use_cache=True)
    assert all(isinstance(layer, RecurrentLayer) for layer in cache.self_attention_cache.layers)
    assert isinstance(cache_of(lone), EncoderDecoderCache)  # a lone cache becomes the self-attention side
    torch.testing.assert_close(out.logits, lone.logits, rtol=0, atol=0)


def test_a_cache_of_attention_layers_is_refused_by_name():
    model = make("talk_lm")
    cache = DynamicCache()
    cache.layers.append(DynamicLayer())
    with pytest.raises(ValueError, match="RecurrentLayer.*DynamicLayer"):
        model(input_ids=torch.tensor([[5, 6, 7]]), cache=cache, use_cache=True)
    with pytest.raises(TypeError, match="transformers Cache"):
        model(input_ids=torch.tensor([[5, 6, 7]]), cache=(), use_cache=True)


def test_batch_rearrangements_move_every_tensor():
    """Contrastive search's batch_repeat_interleave / batch_select_indices, on the states, the cross-attention
    source and the token counters alike."""
    model = make("talk")
    inputs = inputs_for("talk")
    with torch.no_grad():
        cache = cache_of(model(**inputs, use_cache=True))
    layer, cross = cache.self_attention_cache.layers[0], cache.cross_attention_cache.layers[0]
    state, keys, tokens = layer.conv_state().clone(), cross.keys.clone(), layer.real_tokens.clone()
    cache.batch_repeat_interleave(2)
    assert torch.equal(layer.conv_state(), state.repeat_interleave(2, 0))
    assert torch.equal(cross.keys, keys.repeat_interleave(2, 0))
    assert torch.equal(layer.real_tokens, tokens.repeat_interleave(2, 0))
    cache.batch_select_indices(torch.tensor([1, 4]))
    assert torch.equal(layer.conv_state(), state[[0, 2]]) and torch.equal(cross.keys, keys[[0, 2]])


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc"])
def test_beam_reordering_alternates_two_buffers_per_state(name):
    """reorder_cache gathers each fixed-size state into the buffer the previous reorder let go: two buffers per
    state for the whole beam search, none allocated per step; the token counters move with the states."""
    model = make(name)
    with torch.no_grad():
        cache = cache_of(model(**inputs_for(name), use_cache=True))
    layer = cache.self_attention_cache.layers[0]

    def states():
        return [t for t in (*layer.conv_states.values(), *layer.recurrent_states.values()) if t is not None]

    first, tokens = states(), layer.real_tokens.clone()
    expected = [t.clone() for t in first]
    for step, beam_idx in enumerate([torch.tensor([1, 1, 0]), torch.tensor([2, 0, 0])] * 2):  # batch 3
        layer.reorder_cache(beam_idx)
        expected, tokens = [t[beam_idx] for t in expected], tokens[beam_idx]
        assert all(torch.equal(t, e) for t, e in zip(states(), expected, strict=True))
        assert torch.equal(layer.real_tokens, tokens)
        if step % 2 == 1:  # every second reorder writes into the buffers the states started in
            assert [t.data_ptr() for t in states()] == [t.data_ptr() for t in first]
        else:
            assert all(t.data_ptr() != f.data_ptr() for t, f in zip(states(), first, strict=True))


@pytest.mark.parametrize("name", ["talk", "rfa_doc"])
def test_beam_search_reorders_the_decoder_state_not_the_cross_attention_side(name, monkeypatch):
    """Beams move among the hypotheses of one source, whose cross-attention rows are equal: only the decoder's own
    state is reordered (cached beam search equals uncached: test_modeling_common)."""
    model = make(name)
    src, mask = source_batch()
    reordered, reorder = [], RecurrentLayer.reorder_cache
    monkeypatch.setattr(RecurrentLayer, "reorder_cache", lambda self, idx: (reordered.append(self), reorder(self, idx)))
    out = model.generate(input_ids=src, attention_mask=mask, num_beams=3, max_new_tokens=5, min_new_tokens=5,
                         return_dict_in_generate=True)
    cache = cache_of(out)
    assert reordered and all(any(r is layer for layer in cache.self_attention_cache.layers) for r in reordered)
    assert torch.equal(out.sequences, model.generate(input_ids=src, attention_mask=mask, num_beams=3, max_new_tokens=5,
                                                     min_new_tokens=5, use_cache=False))


def test_rows_per_source_finds_the_groups_generate_lays_out():
    """Consecutive groups of equal rows (equal states and mask) -> the group size; anything else -> 1."""
    states, mask = torch.randn(3, 5, 4), torch.ones(3, 5, dtype=torch.long)
    mask[1, 3:] = 0
    beams = states.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)
    assert rows_per_source(*beams) == 4
    assert rows_per_source(beams[0]) == 4
    assert rows_per_source(states, mask) == 1
    same_first_two = torch.cat([states[:1], states[:1], states[2:]]).repeat_interleave(2, 0)
    assert rows_per_source(same_first_two) == 2  # rows 0-3 are equal, but the groups are pairs
    assert rows_per_source(states[:1].expand(6, -1, -1)) == 6  # one source throughout
    differ_in_mask = beams[1].clone()
    differ_in_mask[5, 2] = 0  # row 5 (source 1, beam 1)
    assert rows_per_source(beams[0], differ_in_mask) == 1
    assert rows_per_source(states.repeat_interleave(3, 0)[:-1]) == 1  # groups of 3 that do not fill the batch


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc"])
def test_beam_search_prepares_each_source_once_for_all_its_beams(name, monkeypatch):
    """generate() repeats each source once per beam; the cross-attention side keeps one row per source and its
    beams read it together: the same beams and scores as giving every beam its own copy."""
    model = make(name)
    src, mask = source_batch()
    kwargs = dict(input_ids=src, attention_mask=mask, num_beams=4, max_new_tokens=6, min_new_tokens=6,
                  return_dict_in_generate=True, output_scores=True)
    shared = model.generate(**kwargs)
    cross = cache_of(shared).cross_attention_cache.layers
    held = [t for t in (cross[0].keys, cross[0].recurrent_state()) if t is not None]
    assert held and all(t.shape[0] == src.shape[0] for t in held)
    assert all(layer.rows_per_source == 4 for layer in cross)
    monkeypatch.setattr(modeling_base, "rows_per_source", lambda *args: 1)
    own = model.generate(**kwargs)
    assert cache_of(own).cross_attention_cache.layers[0].rows_per_source == 1
    assert torch.equal(shared.sequences, own.sequences)
    torch.testing.assert_close(shared.sequences_scores, own.sequences_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc"])
def test_a_hooked_cross_attention_reads_every_row_of_its_own(name):
    """A hook on a cross-attention module can make it a function of the row (peft's per-row adapters,
    `generate(adapter_names=...)`, pass one adapter name per row to hooks on its Linear layers): its beams then keep
    their own copies of the source, and every layer inside sees all the batch's rows."""
    model = make(name)
    src, mask = source_batch()
    kwargs = dict(input_ids=src, attention_mask=mask, num_beams=2, max_new_tokens=4, min_new_tokens=4,
                  return_dict_in_generate=True, output_scores=True)
    shared = model.generate(**kwargs)
    rows = []
    for layer in model.model.decoder.layers:
        for module in layer.cross_attention.modules():
            if isinstance(module, torch.nn.Linear):
                module.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[0]))
    hooked = model.generate(**kwargs)
    assert rows and set(rows) == {2 * src.shape[0]}
    assert cache_of(hooked).cross_attention_cache.layers[0].rows_per_source == 1
    assert torch.equal(shared.sequences, hooked.sequences)
    torch.testing.assert_close(shared.sequences_scores, hooked.sequences_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["talk", "rfa_doc"])
def test_rearranging_a_cache_with_shared_sources_gives_each_row_its_source(name):
    """A batch rearrangement of the whole cache (EncoderDecoderCache.reorder_cache, batch_select_indices) first
    repeats each shared source for its rows: the next step is that of a cache that never shared."""
    model = make(name)
    src, mask = source_batch()
    tokens = target_batch(batch=2 * src.shape[0])[:, :4]
    step = tokens[:, 3:]
    with torch.no_grad():  # each source's encoder states repeated for two rows, as generate() does for two beams
        encoder = model.get_encoder()(input_ids=src, attention_mask=mask)
        encoder.last_hidden_state, mask = (t.repeat_interleave(2, 0) for t in (encoder.last_hidden_state, mask))
        caches = []
        for share in (True, False):
            layers = modeling_base.rows_per_source if share else (lambda *args: 1)
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(modeling_base, "rows_per_source", layers)
                out = model(encoder_outputs=encoder, attention_mask=mask, decoder_input_ids=tokens[:, :3],
                            use_cache=True)
            caches.append(cache_of(out))
        assert caches[0].cross_attention_cache.layers[0].rows_per_source == 2
        order = torch.tensor([5, 0, 3, 3, 1, 2])
        for cache in caches:
            cache.reorder_cache(order)
            cache.batch_select_indices(torch.tensor([0, 2, 3]))
        assert caches[0].cross_attention_cache.layers[0].rows_per_source == 1
        rows = order[[0, 2, 3]]
        logits = [model(encoder_outputs=(encoder.last_hidden_state[rows],), attention_mask=mask[rows],
                        decoder_input_ids=step[rows], cache=cache, use_cache=True).logits for cache in caches]
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-5, atol=1e-5)


def test_encoder_and_decoder_rows_must_match():
    model = make("rfa_doc")
    src, mask = source_batch()
    with pytest.raises(ValueError, match="encoder states have 3 rows and the decoder inputs 2"):
        model(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch()[:2])


def test_a_cache_of_shared_sources_refuses_a_batch_they_do_not_divide():
    """A cache whose sources are shared by groups of rows, used for a batch of another size without a reset: an
    error naming the reset, not a reshape failure deep inside a layer."""
    model = make("rfa_doc")
    src, mask = source_batch()
    out = model.generate(input_ids=src, attention_mask=mask, num_beams=4, max_new_tokens=3, min_new_tokens=3,
                         return_dict_in_generate=True)
    cache = cache_of(out)
    src, mask, tokens = src[:1].expand(5, -1), mask[:1].expand(5, -1), target_batch()[:1, :1].expand(5, -1)
    encoder = model.get_encoder()(input_ids=src, attention_mask=mask)
    with pytest.raises(ValueError, match="shared by 4 rows each, but the encoder states have 5 rows"):
        model(encoder_outputs=encoder, attention_mask=mask, decoder_input_ids=tokens, cache=cache, use_cache=True)
