"""Compiled decoding: `generate(cache_implementation="static")` creates a StaticCache of RecurrentLayers up front,
transformers compiles the decoding step once (one graph, no graph break, no recompilation from step to step) and the
tokens equal eager decoding. The state tensors keep their storage from step to step (what a captured CUDA graph
replays). A counting backend stands in for inductor: what is checked is the graph capture, not codegen."""

import pytest
import torch
from transformers import CompileConfig

from transformers import DynamicCache, EncoderDecoderCache, StaticCache

from talk_hf.recurrent_cache import RecurrentLayer
from tests.models.test_modeling_common import decoding_inputs, inputs_for
from tests.models.tiny import ALL, LM, SEQ2SEQ, VOCAB, cache_of, make, source_batch


def counting_compile_config():
    """(graphs list, CompileConfig) whose backend records every graph it is given and runs it as traced."""
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    config = CompileConfig(fullgraph=True, backend=backend, mode=None)
    config._compile_all_devices = True  # transformers compiles on CUDA only unless asked
    return graphs, config


def left_padded_prompt():
    """Two prompts, the first left-padded (the mask is not all ones, so generate() passes it at every step)."""
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(5, VOCAB, (2, 7), generator=g)
    mask = torch.ones_like(ids)
    ids[0, :3], mask[0, :3] = 1, 0
    return dict(input_ids=ids, attention_mask=mask)


def generation_inputs(name):
    if name in SEQ2SEQ:
        src, mask = source_batch()
        inputs = dict(input_ids=src, attention_mask=mask)
        if name.startswith("rfa_doc"):  # a forced prefix with a separator, as in document decoding
            inputs["decoder_input_ids"] = torch.tensor([[2, 7, 8, 4, 9]] * 3)
        return inputs
    return left_padded_prompt()


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sample"])
@pytest.mark.parametrize("name", list(ALL))
def test_static_cache_generation_compiles_one_graph_equal_to_eager(name, sampling):
    model = make(name)
    inputs = generation_inputs(name)
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=sampling, top_k=10 if sampling else None)
    torch.manual_seed(7)
    eager = model.generate(**inputs, **kwargs)
    torch._dynamo.reset()
    graphs, config = counting_compile_config()
    torch.manual_seed(7)
    compiled = model.generate(**inputs, cache_implementation="static", compile_config=config, **kwargs)
    assert len(graphs) == 1  # 7 decoding steps, one graph: nothing in a step changes from one step to the next
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("name", ["talk", "rfa_doc", "dynamic_conv_lm"])
def test_static_cache_beam_search_equals_eager(name):
    """transformers compiles greedy/sampling steps only: beam search (with sequences returned per beam) runs its
    steps eagerly on the static cache, reordering it, and gives the tokens of the default cache."""
    model = make(name)
    inputs = generation_inputs(name)
    kwargs = dict(max_new_tokens=6, min_new_tokens=6, num_beams=3, num_return_sequences=2)
    eager = model.generate(**inputs, **kwargs)
    graphs, config = counting_compile_config()
    torch._dynamo.reset()
    assert torch.equal(model.generate(**inputs, cache_implementation="static", compile_config=config, **kwargs), eager)
    assert graphs == []


def test_without_static_cache_generation_stays_eager():
    """The default cache is created by the first forward, after generate() chose not to compile."""
    model = make("talk_lm")
    graphs, config = counting_compile_config()
    torch._dynamo.reset()
    model.generate(**left_padded_prompt(), max_new_tokens=4, compile_config=config)
    assert graphs == []


def cache_layers(cache):
    if isinstance(cache, EncoderDecoderCache):
        return cache.self_attention_cache.layers + cache.cross_attention_cache.layers
    return cache.layers


def cache_tensors(cache):
    """Every tensor the cache holds: fixed-size states, cross-attention keys/values, token counters."""
    tensors = []
    for layer in cache_layers(cache):
        tensors += [t for t in (*layer.conv_states.values(), *layer.recurrent_states.values()) if t is not None]
        tensors += [t for t in (layer.keys, layer.values, layer.cumulative_length, layer.real_tokens) if t is not None]
    return tensors


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc", "talk_lm"])
def test_cache_tensors_keep_their_storage_across_decoding_steps(name):
    model = make(name)
    key, tokens, inputs = decoding_inputs(model, name)
    with torch.no_grad():
        cache = cache_of(model(**inputs, **{key: tokens[:, :3]}, use_cache=True))
        addresses = [t.data_ptr() for t in cache_tensors(cache)]
        before = [t.clone() for t in cache_tensors(cache)]
        for t in range(3, 6):
            cache = cache_of(model(**inputs, **{key: tokens[:, t : t + 1]}, cache=cache, use_cache=True))
    assert [t.data_ptr() for t in cache_tensors(cache)] == addresses
    assert cache.get_seq_length() == 6 and cache_layers(cache)[0].real_tokens.tolist() == [6, 6, 6]
    changed = [not torch.equal(a, b) for a, b in zip(before, cache_tensors(cache))]
    assert any(changed)  # written in place, not left behind


def test_positions_count_real_tokens_only():
    cache = RecurrentLayer()
    mask = torch.tensor([[0, 0, 1], [1, 1, 1]])
    assert cache.positions(mask, 2, 3, "cpu").tolist() == [[0, 0, 0], [0, 1, 2]]
    cache.advance(mask, 2, 3, "cpu")
    assert cache.positions(None, 2, 2, "cpu").tolist() == [[1, 2], [3, 4]]
    assert cache.positions(torch.tensor([[1, 0], [1, 1]]), 2, 2, "cpu").tolist() == [[1, 1], [3, 4]]
    cache.advance(None, 2, 2, "cpu")
    assert cache.get_seq_length() == 5 and cache.real_tokens.tolist() == [3, 5]


@pytest.mark.parametrize("name", ["talk_lm", "dynamic_conv_lm", "rfa_doc"])
def test_backpropagation_through_a_cache_gives_the_full_forward_gradients(name):
    """Training through the cache (truncated backpropagation) gets the gradients of one full forward."""
    overrides = dict(resample_random_features=False) if name == "rfa_doc" else {}  # same features in every call
    model = make(name, **overrides).train()
    inputs = inputs_for(name)
    key = "decoder_input_ids" if name in SEQ2SEQ else "input_ids"
    tokens = inputs.pop(key)
    inputs.pop("attention_mask" if name in LM else "unused", None)
    grads = []
    for chunks in ([(0, tokens.shape[1])], [(0, 3), (3, 4), (4, tokens.shape[1])]):
        model.zero_grad()
        cache, logits = None, []
        for start, stop in chunks:
            out = model(**inputs, **{key: tokens[:, start:stop]}, cache=cache, use_cache=True)
            cache = cache_of(out)
            logits.append(out.logits)
        (torch.cat(logits, 1) ** 2).mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for n in grads[0]:
        torch.testing.assert_close(grads[1][n], grads[0][n], rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu_check.sh runs it)")
@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc", "talk_lm"])
def test_cuda_graph_decoding_equals_eager(name):
    """transformers' default CompileConfig (mode "reduce-overhead") captures the decoding step in a CUDA graph:
    nothing in it makes inductor skip the capture, and replays give the eager tokens."""
    from torch._dynamo.utils import counters

    model = make(name).cuda()
    inputs = {k: v.cuda() for k, v in generation_inputs(name).items()}
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False)
    eager = model.generate(**inputs, **kwargs)
    torch._dynamo.reset()
    counters.clear()
    config = CompileConfig(fullgraph=True)
    runs = [model.generate(**inputs, cache_implementation="static", compile_config=config, **kwargs) for _ in range(2)]
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert all(torch.equal(r, eager) for r in runs)


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc", "talk_lm"])
def test_a_training_step_compiles_in_one_graph_with_the_eager_gradients(name):
    """transformers' test_torch_compile_for_training on the CPU (aot_eager): a training step of the model in train
    mode compiles with fullgraph=True and gives eager's loss and gradients (dropouts 0; RFA-doc's resampled
    projections drawn from the same seed)."""
    inputs = inputs_for(name)
    inputs["labels"] = inputs["decoder_input_ids" if name in SEQ2SEQ else "input_ids"]
    model = make(name).train()

    def step(forward):
        model.zero_grad(set_to_none=True)
        torch.manual_seed(0)
        loss = forward(**inputs).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    loss, grads = step(model)
    compiled_loss, compiled_grads = step(torch.compile(model, backend="aot_eager", fullgraph=True))
    torch.testing.assert_close(compiled_loss, loss)
    assert compiled_grads.keys() == grads.keys()
    for n in grads:
        torch.testing.assert_close(compiled_grads[n], grads[n], rtol=1e-4, atol=1e-5)
