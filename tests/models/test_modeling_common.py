"""Checks every talk_hf model class must pass (the transformers ModelTesterMixin idea): shapes, loss, save/load,
tied weights, Auto classes, cached vs uncached decoding, beam reordering, padding and batch invariance,
resize_token_embeddings, gradient checkpointing, torch.compile, autocast and config validation."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from transformers import Cache

from talk_hf.recurrent_cache import RecurrentLayer
from tests.models.tiny import ALL, LM, SEQ2SEQ, VOCAB, cache_of, make, source_batch, target_batch

SEQ2SEQ_NAMES, LM_NAMES = list(SEQ2SEQ), list(LM)


def seq2seq_inputs():
    src, mask = source_batch()
    return dict(input_ids=src, attention_mask=mask, decoder_input_ids=target_batch())


def lm_inputs():
    ids = target_batch(length=11)
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids))


def inputs_for(name):
    return seq2seq_inputs() if name in SEQ2SEQ else lm_inputs()


# --- forward, loss, gradients ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ALL))
def test_forward_shapes_and_loss(name):
    model = make(name)
    inputs = inputs_for(name)
    out = model(**inputs, output_hidden_states=True)
    T = inputs["decoder_input_ids" if name in SEQ2SEQ else "input_ids"].shape[1]
    assert out.logits.shape == (3, T, VOCAB)
    hidden = out.decoder_hidden_states if name in SEQ2SEQ else out.hidden_states
    assert len(hidden) == model.config.decoder_layers + 1
    # transformers' convention: the last hidden state is the output, after any final layer norm
    if name in SEQ2SEQ:
        torch.testing.assert_close(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)
        torch.testing.assert_close(hidden[-1], model.model(**inputs).last_hidden_state)
    else:
        torch.testing.assert_close(hidden[-1], model.model(**inputs).last_hidden_state)
    labels = target_batch(seed=5) if name in SEQ2SEQ else inputs["input_ids"]
    model.train()
    kwargs = {k: v for k, v in inputs.items() if k != "decoder_input_ids"}
    loss = model(**kwargs, labels=labels).loss
    assert loss.ndim == 0 and torch.isfinite(loss) and loss > 0
    loss.backward()
    missing = [n for n, p in model.named_parameters()
               if p.requires_grad and (p.grad is None or p.grad.abs().sum() == 0)]
    assert not missing, f"parameters without gradient: {missing}"


@pytest.mark.parametrize("name", list(ALL))
def test_output_switches_from_the_config(name):
    """config.output_hidden_states and config.return_dict apply when the keyword is absent; the keyword wins."""
    model = make(name)
    inputs = inputs_for(name)
    with torch.no_grad():
        expected = model(**inputs, output_hidden_states=True)
        model.config.output_hidden_states = True
        from_config = model(**inputs)
        assert from_config.keys() == expected.keys()
        for key in [k for k in expected.keys() if k.endswith("hidden_states")]:
            for got, want in zip(from_config[key], expected[key], strict=True):
                torch.testing.assert_close(got, want)
        assert model(**inputs, output_hidden_states=False).keys() < expected.keys()
        model.config.output_hidden_states = False
        as_tuple = model(**inputs, return_dict=False)
        model.config.return_dict = False
        assert isinstance(model(**inputs), tuple) and not isinstance(model(**inputs, return_dict=True), tuple)
        model.config.return_dict = True
        as_dict = model(**inputs)
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(as_dict.to_tuple())
    torch.testing.assert_close(as_tuple[0], as_dict.logits)


@pytest.mark.parametrize("name", list(ALL))
def test_attention_weights_are_refused_not_ignored(name):
    """Under transformers' default implementation ("sdpa") the config switch is refused by transformers, as for its
    own models; under "eager", and as a keyword under either, by the model."""
    model = make(name)
    inputs = inputs_for(name)
    with torch.no_grad():
        model(**inputs, output_attentions=False)
        with pytest.raises(ValueError, match="no attention weights"):
            model(**inputs, output_attentions=True)
        with pytest.raises(ValueError, match="not supported when using the `attn_implementation` set to sdpa"):
            model.config.output_attentions = True
        model = make(name, attn_implementation="eager")
        model.config.output_attentions = True
        with pytest.raises(ValueError, match="no attention weights"):
            model(**inputs)
        model(**inputs, output_attentions=False)  # the keyword wins


@pytest.mark.parametrize("name", list(ALL))
def test_set_input_embeddings_replaces_the_embedding(name):
    model = make(name)
    embedding = torch.nn.Embedding(VOCAB, model.config.d_model, padding_idx=model.config.pad_token_id)
    model.set_input_embeddings(embedding)
    assert model.get_input_embeddings() is embedding
    inputs = inputs_for(name)
    with torch.no_grad():
        before = model(**inputs).logits
        embedding.weight.mul_(2)
        assert not torch.allclose(model(**inputs).logits, before)  # the forward reads the new module


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("name", LM_NAMES)
def test_lm_loss_takes_labels_or_pre_shifted_targets(name, smoothing):
    """labels are shifted inside; shift_labels (what sequence-parallel trainers pass) are used as given; both with
    the config's label smoothing."""
    model = make(name, label_smoothing=smoothing)
    ids = target_batch(length=11)
    targets = target_batch(length=11, seed=4)
    targets[:, -1] = targets[0, 0] = -100
    with torch.no_grad():
        logits = model(ids).logits.float()

        def expected(t):
            return F.cross_entropy(logits.flatten(0, 1), t.flatten(), ignore_index=-100, label_smoothing=smoothing)

        shifted_ids = F.pad(ids[:, 1:], (0, 1), value=-100)
        torch.testing.assert_close(model(ids, labels=ids).loss, expected(shifted_ids))
        torch.testing.assert_close(model(ids, shift_labels=targets).loss, expected(targets))
        torch.testing.assert_close(model(ids, shift_labels=shifted_ids).loss, model(ids, labels=ids).loss)
        ignored = int(targets[1, 2])  # ignore_index names the id to leave out, with or without smoothing
        other = targets.masked_fill(targets == -100, ignored)
        torch.testing.assert_close(model(ids, shift_labels=other, ignore_index=ignored).loss,
                                   F.cross_entropy(logits.flatten(0, 1), other.flatten(), ignore_index=ignored,
                                                   label_smoothing=smoothing))


def test_labels_build_decoder_inputs_and_ignore_padding():
    model = make("talk")
    src, mask = source_batch()
    labels = target_batch()
    labels[0, -2:] = -100
    out = model(input_ids=src, attention_mask=mask, labels=labels)
    decoder_inputs = model.prepare_decoder_input_ids_from_labels(labels)
    assert (decoder_inputs[0, 0] == model.config.decoder_start_token_id
            and decoder_inputs[0, -1] == model.config.pad_token_id)
    logits = model(input_ids=src, attention_mask=mask, decoder_input_ids=decoder_inputs).logits
    keep = labels != -100
    expected = torch.nn.functional.cross_entropy(logits[keep], labels[keep])
    torch.testing.assert_close(out.loss, expected)
    with pytest.raises(ValueError, match="decoder_input_ids or labels"):
        model(input_ids=src, attention_mask=mask)


# --- save / load / Auto classes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ALL))
def test_save_load_round_trip_with_tied_weights_stored_once(name, tmp_path):
    model = make(name)
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    embedding_keys = [k for k in keys if "embed_tokens" in k or k.endswith("shared.weight") or k.startswith("lm_head")]
    assert len(embedding_keys) == 1, embedding_keys  # the tied embedding is stored once
    head_class = AutoModelForSeq2SeqLM if name in SEQ2SEQ else AutoModelForCausalLM
    loaded = head_class.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    assert loaded.lm_head.weight.data_ptr() == loaded.get_input_embeddings().weight.data_ptr()
    state, loaded_state = model.state_dict(), loaded.state_dict()
    assert state.keys() == loaded_state.keys()
    for key, value in state.items():
        assert torch.equal(value, loaded_state[key]), key
    inputs = inputs_for(name)
    assert torch.equal(model(**inputs).logits, loaded(**inputs).logits)
    assert type(AutoConfig.from_pretrained(tmp_path)) is type(model.config)
    base = AutoModel.from_pretrained(tmp_path)
    assert type(base) is ALL[name][1]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == model.config.model_type and "auto_map" in config


@pytest.mark.parametrize("name", list(ALL))
def test_weights_offloaded_to_disk_compute_what_the_loaded_model_does(name, tmp_path):
    """from_pretrained(device_map="auto") with too little memory for the model puts some modules' weights on disk;
    accelerate's hooks load each module's weights for its forward (a module must read its parameters and buffers in
    its own forward). Logits and greedy decoding equal the model's in memory."""
    from accelerate.utils import compute_module_sizes

    model = make(name)
    model.save_pretrained(tmp_path / "model")
    head_class = AutoModelForSeq2SeqLM if name in SEQ2SEQ else AutoModelForCausalLM
    budget = {"cpu": compute_module_sizes(model)[""] // 2}
    offloaded = head_class.from_pretrained(tmp_path / "model", device_map="auto", max_memory=budget,
                                           offload_folder=tmp_path / "offload").eval()
    assert "disk" in set(offloaded.hf_device_map.values())
    inputs = inputs_for(name)
    with torch.no_grad():
        assert torch.allclose(offloaded(**inputs).logits, model(**inputs).logits, rtol=1e-5, atol=1e-6)
    prompt = {k: v for k, v in inputs.items() if not k.startswith("decoder")}
    settings = dict(max_new_tokens=4, do_sample=False, pad_token_id=model.config.pad_token_id)
    assert torch.equal(offloaded.generate(**prompt, **settings), model.generate(**prompt, **settings))


@pytest.mark.parametrize("name", list(ALL))
def test_attention_implementation_sdpa_or_eager_loads_and_computes_the_same(name, tmp_path):
    """The softmax attentions (cross-attention, the RFA-doc encoder) run torch's scaled_dot_product_attention, so
    attn_implementation="sdpa" (what scripts pass for speed) is accepted, as "eager" is; neither changes a logit.
    Implementations the models do not have are refused by transformers."""
    model = make(name)
    model.save_pretrained(tmp_path)
    head_class = AutoModelForSeq2SeqLM if name in SEQ2SEQ else AutoModelForCausalLM
    inputs = inputs_for(name)
    for implementation in ("sdpa", "eager"):
        loaded = head_class.from_pretrained(tmp_path, attn_implementation=implementation).eval()
        assert loaded.config._attn_implementation == implementation
        assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)
    with pytest.raises(ValueError, match="Flash Attention 2"):
        head_class.from_pretrained(tmp_path, attn_implementation="flash_attention_2")


def test_untied_embeddings_are_saved_separately(tmp_path):
    model = make("talk", tie_word_embeddings=False)
    assert model.lm_head.weight.data_ptr() != model.get_input_embeddings().weight.data_ptr()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    assert not torch.equal(loaded.lm_head.weight, loaded.get_input_embeddings().weight)


# --- generation: cached == uncached ------------------------------------------------------------------------------

GENERATION_MODES = {
    "greedy": dict(),
    "beam": dict(num_beams=3),
    "beam-return2": dict(num_beams=3, num_return_sequences=2),
    "sample": dict(do_sample=True, top_k=10),
    "sample-return2": dict(do_sample=True, num_return_sequences=2),
}


def generate(model, inputs, use_cache, **kwargs):
    torch.manual_seed(7)
    return model.generate(**inputs, max_new_tokens=9, min_new_tokens=9, use_cache=use_cache, **kwargs)


@pytest.mark.parametrize("mode", list(GENERATION_MODES))
@pytest.mark.parametrize("name", SEQ2SEQ_NAMES)
def test_seq2seq_cached_generation_equals_uncached(name, mode):
    model = make(name)
    src, mask = source_batch()
    inputs = dict(input_ids=src, attention_mask=mask)
    if name.startswith("rfa_doc"):  # a forced prefix with a separator, as in document decoding
        inputs["decoder_input_ids"] = torch.tensor([[2, 7, 8, 4, 9]] * 3)
    cached = generate(model, inputs, True, **GENERATION_MODES[mode])
    assert torch.equal(cached, generate(model, inputs, False, **GENERATION_MODES[mode]))


@pytest.mark.parametrize("mode", list(GENERATION_MODES))
@pytest.mark.parametrize("name", LM_NAMES)
def test_lm_cached_generation_equals_uncached(name, mode):
    model = make(name)
    ids = target_batch(length=6, with_separators=False)
    inputs = dict(input_ids=ids, attention_mask=torch.ones_like(ids))
    cached = generate(model, inputs, True, **GENERATION_MODES[mode])
    assert torch.equal(cached, generate(model, inputs, False, **GENERATION_MODES[mode]))


@pytest.mark.parametrize("name", ["talk", "lightconv", "rfa_doc"])
def test_beam_search_really_needs_cache_reordering(name, monkeypatch):
    """The cached-beam test is sensitive: without reordering the state, beam search gives other tokens (for at
    least one of a few models and inputs; a single tiny model can happen to keep its beams in order)."""
    kwargs = dict(num_beams=4, max_new_tokens=9, min_new_tokens=9)
    runs = []
    for seed in range(4):
        model = make(name, seed=seed)
        src, mask = source_batch(seed=seed + 1)
        runs.append((model, src, mask, model.generate(input_ids=src, attention_mask=mask, use_cache=False, **kwargs)))
    monkeypatch.setattr(RecurrentLayer, "reorder_cache", lambda self, beam_idx: None)
    broken = [m.generate(input_ids=s, attention_mask=a, use_cache=True, **kwargs) for m, s, a, _ in runs]
    assert any(not torch.equal(b, r[3]) for b, r in zip(broken, runs))


@pytest.mark.parametrize("name", list(ALL))
def test_incremental_logits_equal_full_forward(name):
    """A prefix, then one token at a time and a chunk, from the recurrent cache == one full forward pass."""
    model = make(name)
    inputs = inputs_for(name)
    key = "decoder_input_ids" if name in SEQ2SEQ else "input_ids"
    tokens = inputs.pop(key)
    if name in LM:
        inputs.pop("attention_mask")
    full = model(**inputs, **{key: tokens}, use_cache=False).logits
    cache, outs = None, []
    for start, stop in [(0, 3), (3, 4), (4, 5), (5, tokens.shape[1])]:
        out = model(**inputs, **{key: tokens[:, start:stop]}, cache=cache, use_cache=True)
        cache = cache_of(out)
        outs.append(out.logits)
    assert isinstance(cache, Cache) and cache.get_seq_length() == tokens.shape[1]
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)


class HostSyncs(TorchDispatchMode):
    """Records the ops that make the host wait for the device (a tensor read as a Python number or bool) or whose
    output shape depends on tensor values: either breaks CUDA-graph capture of a decoding step."""

    SYNCING = {"aten._local_scalar_dense.default", "aten.is_nonzero.default", "aten.equal.default",
               "aten.nonzero.default", "aten.masked_select.default", "aten.unique_dim.default",
               "aten._unique2.default", "aten.repeat_interleave.Tensor"}

    def __init__(self):
        super().__init__()
        self.found, self.calls = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        if str(func) in self.SYNCING:
            self.found.append(str(func))
        return func(*args, **(kwargs or {}))


def decoding_inputs(model, name):
    """(input key, tokens to decode (B, T), other forward inputs as `generate()` gives them to a decoding step: the
    encoder output and source mask for encoder-decoders, nothing for LMs)."""
    inputs = inputs_for(name)
    key = "decoder_input_ids" if name in SEQ2SEQ else "input_ids"
    tokens = inputs.pop(key)
    if name not in SEQ2SEQ:
        return key, tokens, {}
    return key, tokens, dict(encoder_outputs=model.get_encoder()(**inputs), attention_mask=inputs["attention_mask"])


@pytest.mark.parametrize("name", list(ALL))
def test_decoding_steps_never_wait_for_the_device(name):
    """After the prefill, a decoding step (one new token from the recurrent cache, the encoder output given as
    `generate()` gives it) runs no op that syncs the host with the device or has a value-dependent shape."""
    model = make(name)
    key, tokens, inputs = decoding_inputs(model, name)
    with torch.no_grad():
        cache = cache_of(model(**inputs, **{key: tokens[:, :3]}, use_cache=True))
        for t in range(3, 6):
            with HostSyncs() as mode:
                out = model(**inputs, **{key: tokens[:, t : t + 1]}, cache=cache, use_cache=True)
            cache = cache_of(out)
            assert mode.calls > 0 and mode.found == [], mode.found


def test_assisted_decoding_is_refused_for_a_recurrent_state():
    model, assistant = make("talk_lm"), make("talk_lm", seed=3)
    ids = target_batch(batch=1, length=5, with_separators=False)
    with pytest.raises(ValueError, match="stateful"):
        model.generate(ids, assistant_model=assistant, max_new_tokens=3)


# --- padding and batching ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["talk", "rfa_doc", "talk_lm"])
def test_masks_other_than_padding_masks_are_refused(name):
    """4D attention masks, a mask of another batch size or length (a decoder mask longer than its inputs without a
    cache: positions counted from tokens that are not there): a clear error naming the argument, never a silently
    misread mask."""
    model, inputs = make(name), inputs_for(name)
    mask = inputs["attention_mask"]
    B, L = mask.shape
    four_d = mask[:, None, None, :].expand(B, 1, L, L)
    bad = [("attention_mask", four_d), ("attention_mask", mask[:1]), ("attention_mask", mask[:, :-1])]
    if name in SEQ2SEQ:
        T = inputs["decoder_input_ids"].shape[1]
        bad += [("decoder_attention_mask", torch.ones(B, 1, T, T)), ("decoder_attention_mask", torch.ones(B, T - 1))]
    for arg, value in bad:
        with pytest.raises(ValueError, match=f"^{arg} must be a .* padding mask"):
            model(**dict(inputs, **{arg: value}))
    # a decoder mask longer than its inputs covers tokens before them, which only a cache can hold
    arg = "decoder_attention_mask" if name in SEQ2SEQ else "attention_mask"
    target = inputs.get("decoder_input_ids", inputs["input_ids"])
    longer = torch.cat([torch.ones(B, 3, dtype=torch.long), torch.ones_like(target)], 1)
    with pytest.raises(ValueError, match=f"^{arg} has {longer.shape[1]} columns for {target.shape[1]} tokens"):
        model(**dict(inputs, **{arg: longer}), use_cache=False)
    if name in SEQ2SEQ:  # given encoder outputs, the decoder checks the source mask against them
        encoder_outputs = model.get_encoder()(input_ids=inputs["input_ids"], attention_mask=mask)
        with pytest.raises(ValueError, match="^attention_mask must be a .* padding mask"):
            model(attention_mask=four_d, encoder_outputs=encoder_outputs, decoder_input_ids=inputs["decoder_input_ids"])


@pytest.mark.parametrize("name", ["talk", "rfa_doc", "talk_lm"])
def test_inputs_without_tokens_or_a_batch_dimension_are_refused_by_name(name):
    """A zero-length source or target (input_ids of shape (B, 0), or such embeddings): an error naming the argument,
    not a reshape error from inside a layer (seq2seq) or empty logits that generate() then fails to index (LMs); an
    unbatched (T,) input_ids: an error naming the shape it needs, not an IndexError."""
    model, inputs = make(name), inputs_for(name)
    B = inputs["input_ids"].shape[0]
    empty_ids, empty_embeds = torch.zeros(B, 0, dtype=torch.long), torch.zeros(B, 0, model.config.d_model)
    bad = [("input_ids", dict(inputs, input_ids=empty_ids, attention_mask=None)),
           ("inputs_embeds", dict(inputs, input_ids=None, inputs_embeds=empty_embeds, attention_mask=None))]
    if name in SEQ2SEQ:
        bad += [("decoder_input_ids", dict(inputs, decoder_input_ids=empty_ids)),
                ("decoder_inputs_embeds", dict(inputs, decoder_input_ids=None, decoder_inputs_embeds=empty_embeds))]
    for arg, kwargs in bad:
        with pytest.raises(ValueError, match=f"^{arg} holds no tokens \\(shape \\({B}, 0"):
            model(**kwargs)
    unbatched = dict(inputs, input_ids=inputs["input_ids"][0], attention_mask=None)
    with pytest.raises(ValueError, match="^input_ids must be batched, \\(B, T\\), got shape"):
        model(**unbatched)


@pytest.mark.parametrize("name", SEQ2SEQ_NAMES)
def test_source_padding_side_and_amount_do_not_matter(name):
    model = make(name)
    src = torch.randint(5, VOCAB, (1, 6), generator=torch.Generator().manual_seed(3))
    dec = target_batch(batch=1)
    expected = model(input_ids=src, decoder_input_ids=dec).logits
    pad = torch.ones(1, 4, dtype=torch.long)
    for ids, mask in [
        (torch.cat([src, pad], 1), torch.cat([torch.ones_like(src), 0 * pad], 1)),  # right
        (torch.cat([pad, pad, src], 1), torch.cat([0 * pad, 0 * pad, torch.ones_like(src)], 1)),  # left, more
    ]:
        logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits
        torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", LM_NAMES)
def test_left_padded_prompt_generates_like_the_row_alone(name):
    model = make(name)
    g = torch.Generator().manual_seed(4)
    short, long = torch.randint(5, VOCAB, (1, 3), generator=g), torch.randint(5, VOCAB, (1, 7), generator=g)
    ids = torch.cat([torch.cat([torch.ones(1, 4, dtype=torch.long), short], 1), long])
    mask = torch.cat([torch.cat([torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 3, dtype=torch.long)], 1),
                      torch.ones(1, 7, dtype=torch.long)])
    batch = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6)
    alone = model.generate(input_ids=short, attention_mask=torch.ones_like(short), max_new_tokens=6, min_new_tokens=6)
    assert torch.equal(batch[0, 4:], alone[0])
    long_alone = model.generate(input_ids=long, max_new_tokens=6, min_new_tokens=6)
    assert torch.equal(batch[1], long_alone[0])


@pytest.mark.parametrize("name", list(ALL))
def test_batch_equals_rows_one_at_a_time(name):
    model = make(name)
    inputs = inputs_for(name)
    batched = model(**inputs).logits
    for b in range(3):
        row = {k: v[b : b + 1] for k, v in inputs.items()}
        if "attention_mask" in row and name in SEQ2SEQ:  # drop the row's own padding entirely
            real = int(row["attention_mask"].sum())
            row["input_ids"], row["attention_mask"] = row["input_ids"][:, :real], row["attention_mask"][:, :real]
        torch.testing.assert_close(model(**row).logits, batched[b : b + 1], rtol=1e-5, atol=1e-5)


# --- the rest of the transformers toolbox --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc", "talk_lm"])
def test_resize_token_embeddings_keeps_tying(name):
    model = make(name)
    model.resize_token_embeddings(VOCAB + 7)
    assert model.config.vocab_size == VOCAB + 7
    assert model.lm_head.weight.shape[0] == VOCAB + 7
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    inputs = inputs_for(name)
    assert model(**inputs).logits.shape[-1] == VOCAB + 7


@pytest.mark.parametrize("name,count,lists", [("talk", "encoder_layers", "encoder_max_offsets"),
                                              ("dynamic_conv", "decoder_layers", "decoder_kernel_sizes"),
                                              ("talk_lm", "decoder_layers", "decoder_max_offsets")])
def test_a_layer_count_set_without_its_per_layer_lists_is_refused_by_name(name, count, lists, tmp_path):
    """A count set on a built config is past the lists' own checks: the model refuses it, and
    from_pretrained(path, <count>=N), which sets it so, checks the config it loads."""
    config_class = ALL[name][0]
    make(name).config.save_pretrained(tmp_path)
    config = config_class.from_pretrained(tmp_path)
    setattr(config, count, 3)
    with pytest.raises(ValueError, match=f"{lists} has 2 entries but {count} is 3: set {lists} too"):
        ALL[name][2](config)
    with pytest.raises(ValueError, match=f"{lists} has 2 entries but {count} is 3: set {lists} too"):
        config_class.from_pretrained(tmp_path, **{count: 3})


@pytest.mark.parametrize("name,overrides,filled", [
    ("talk", dict(conv_dim=None), dict(conv_dim=16)),
    ("talk", dict(decoder_layers=3, decoder_max_offsets=None), dict(decoder_max_offsets=[1, 3, 7])),
    ("dynamic_conv", dict(encoder_layers=1, encoder_kernel_sizes=None), dict(encoder_kernel_sizes=[3])),
    ("talk_lm", dict(decoder_layers=1, decoder_max_offsets=None), dict(decoder_max_offsets=[1])),
])
def test_a_none_override_on_load_takes_the_default_a_new_config_gets(name, overrides, filled, tmp_path):
    """None means "the default" in a config's arguments (the paper's per-layer pattern, conv_dim = d_model); an
    override of from_pretrained takes it the same way, so the loaded config builds a model."""
    config_class, _, head_class, _ = ALL[name]
    make(name).config.save_pretrained(tmp_path)
    config = config_class.from_pretrained(tmp_path, **overrides)
    for field, value in filled.items():
        assert getattr(config, field) == value
    head_class(config)


def test_an_override_of_the_left_reach_on_load_moves_a_right_reach_that_followed_it(tmp_path):
    """A TaLK config's right reach defaults to its left one; a saved config holds both, and an override of the left
    reach on load moves the right one with it where it was the same (as a new config derives it), not otherwise."""
    config_class = ALL["talk"][0]
    make("talk", encoder_max_offsets=[1, 3], encoder_max_right_offsets=None).config.save_pretrained(tmp_path)
    loaded = config_class.from_pretrained(tmp_path, encoder_max_offsets=[6, 6])
    assert loaded.encoder_max_right_offsets == [6, 6]
    grown = config_class.from_pretrained(tmp_path, encoder_layers=3, encoder_max_offsets=None)
    assert grown.encoder_max_offsets == grown.encoder_max_right_offsets == [1, 3, 7]
    make("talk", encoder_max_offsets=[1, 3], encoder_max_right_offsets=[2, 0]).config.save_pretrained(tmp_path)
    assert config_class.from_pretrained(tmp_path, encoder_max_offsets=[6, 6]).encoder_max_right_offsets == [2, 0]


@pytest.mark.parametrize("name", ["talk", "rfa_doc", "dynamic_conv_lm"])
def test_layer_types_given_as_the_config_derives_them_load_and_others_are_refused(name, tmp_path):
    """transformers' configs may carry `layer_types` (a config.json written by hand or by other tools): the list
    the config derives is accepted, any other is a ValueError naming the field."""
    config = make(name).config
    config_class = type(config)
    layer_types = config.layer_types
    assert config_class(**{**config.to_dict(), "layer_types": layer_types}).layer_types == layer_types
    assert config_class.from_dict({**config.to_dict(), "layer_types": layer_types}).layer_types == layer_types
    with pytest.raises(ValueError, match="layer_types must be"):
        config_class(**{**config.to_dict(), "layer_types": ["full_attention"] * len(layer_types)})
    with pytest.raises(ValueError, match="layer_types must be"):
        config_class(**{**config.to_dict(), "layer_types": layer_types[:1]})


@pytest.mark.parametrize("name", list(LM))
def test_logits_to_keep_takes_a_count_or_positions(name):
    model = make(name)
    inputs = inputs_for(name)
    logits = model(**inputs).logits
    torch.testing.assert_close(model(**inputs, logits_to_keep=2).logits, logits[:, -2:])
    torch.testing.assert_close(model(**inputs, logits_to_keep=torch.tensor([1, 4])).logits, logits[:, [1, 4]])


@pytest.mark.parametrize("embeddings", [dict(), dict(encoder_vocab_size=40, tie_encoder_embeddings=False),
                                        dict(tie_encoder_embeddings=False), dict(tie_word_embeddings=False)],
                         ids=["tied", "source-vocab", "own-source-embedding", "untied"])
def test_resize_token_embeddings_keeps_every_trained_row(embeddings, tmp_path):
    """Resizing the vocabulary keeps what the model computes for the old ids, whether the encoder shares the
    embedding, has its own source vocabulary (converted fairseq models; it keeps its size) or its own copy; and the
    resized model saves and loads as it is."""
    model = make("talk", **embeddings)
    source, target = torch.randint(5, 40, (2, 7)), torch.randint(5, 40, (2, 5))
    encoded = model.get_encoder()(input_ids=source).last_hidden_state
    logits = model(input_ids=source, decoder_input_ids=target).logits
    model.resize_token_embeddings(VOCAB + 7, mean_resizing=False)
    torch.testing.assert_close(model.get_encoder()(input_ids=source).last_hidden_state, encoded)
    resized = model(input_ids=source, decoder_input_ids=target).logits
    torch.testing.assert_close(resized[..., :VOCAB], logits)
    encoder_rows = model.get_encoder().embed.embed_tokens.num_embeddings
    own_source = embeddings.get("tie_encoder_embeddings", True) is False  # keeps its rows, recorded in the config
    assert encoder_rows == (embeddings.get("encoder_vocab_size", VOCAB) if own_source else VOCAB + 7)
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    torch.testing.assert_close(reloaded(input_ids=source, decoder_input_ids=target).logits, resized)


@pytest.mark.parametrize("mean_resizing", [False, True])
def test_resize_token_embeddings_initialises_an_untied_encoder_as_asked(mean_resizing):
    """The encoder's own copy of the vocabulary gets its new rows as the decoder's do: from the old rows' mean and
    covariance, or from the initialiser (mean 0) with mean_resizing=False."""
    model = make("talk", tie_word_embeddings=False)
    with torch.no_grad():
        for embedding in (model.get_encoder().embed.embed_tokens, model.get_input_embeddings()):
            embedding.weight.normal_(5.0, 0.1)
    model.resize_token_embeddings(VOCAB + 7, mean_resizing=mean_resizing)
    for embedding in (model.get_encoder().embed.embed_tokens, model.get_input_embeddings()):
        new_rows = embedding.weight[VOCAB:]
        assert new_rows.shape[0] == 7
        assert abs(new_rows.mean().item() - (5.0 if mean_resizing else 0.0)) < 0.5


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("name", ["talk", "lightconv", "rfa_doc-nogate", "dynamic_conv_lm"])
def test_gradient_checkpointing_gives_the_same_gradients(name, reentrant):
    labels = target_batch(seed=9) if name in SEQ2SEQ else None
    grads = []
    for checkpointing in (False, True):
        model = make(name).train()
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
            assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
        inputs = {k: v for k, v in inputs_for(name).items() if k != "decoder_input_ids"}
        model(**inputs, labels=labels if labels is not None else inputs["input_ids"]).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for key in grads[0]:
        torch.testing.assert_close(grads[1][key], grads[0][key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["talk", "lightconv", "rfa_doc", "talk_lm"])
def test_frozen_embeddings_with_input_grads_and_reentrant_checkpointing_train_every_layer(name):
    """The adapter fine-tuning recipe: embeddings frozen, enable_input_require_grads(), reentrant checkpointing. Each
    stack's embedding output must require grad, or reentrant checkpointing gives that stack's layers no gradients;
    the encoder's embedding is a module of its own, tied to the decoder's by weight. The gradients equal those of
    the same model without checkpointing."""
    labels = target_batch(seed=9) if name in SEQ2SEQ else None
    inputs = {k: v for k, v in inputs_for(name).items() if k != "decoder_input_ids"}
    grads = []
    for checkpointing in (False, True):
        model = make(name).train()
        for embedding in model.modules():
            if isinstance(embedding, torch.nn.Embedding):
                embedding.weight.requires_grad_(False)
        if checkpointing:
            model.enable_input_require_grads()
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        model(**inputs, labels=labels if labels is not None else inputs["input_ids"]).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
        if checkpointing:
            model.disable_input_require_grads()
            assert model._require_grads_hooks == []
    missing = sorted(n for n, g in grads[1].items() if g is None)
    assert not missing, missing[:4]
    for key in grads[0]:
        torch.testing.assert_close(grads[1][key], grads[0][key], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc", "talk_lm"])
def test_torch_compile_forward(name):
    model = make(name)
    inputs = inputs_for(name)
    compiled = torch.compile(model, backend="aot_eager")
    torch.testing.assert_close(compiled(**inputs, use_cache=False).logits, model(**inputs, use_cache=False).logits)


class _Logits(torch.nn.Module):
    """A model's forward with use_cache=True (generate()'s prefill) -> its logits alone."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, **inputs):
        return self.model(**inputs, use_cache=True).logits


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc"])
def test_a_forward_that_fills_the_cache_exports_and_compiled_beams_share_sources(name):
    """Telling which rows share a source compares rows (data-dependent control flow): under torch.export every row
    keeps its own source (the same numbers); under torch.compile the graph breaks there, so the beams of a compiled
    model still share one source each."""
    model = make(name)
    inputs = inputs_for(name)
    with torch.no_grad():
        exported = torch.export.export(_Logits(model), (), inputs, strict=False).module()
        torch.testing.assert_close(exported(**inputs), model(**inputs, use_cache=True).logits)
    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend="eager")
    source = {k: v for k, v in inputs.items() if not k.startswith("decoder")}
    out = model.generate(**source, num_beams=3, max_new_tokens=2, return_dict_in_generate=True)
    assert out.past_key_values.cross_attention_cache.layers[0].rows_per_source == 3


@pytest.mark.parametrize("name", SEQ2SEQ_NAMES)
def test_get_encoder_takes_transformers_modality_argument(name):
    """PreTrainedModel.get_encoder(modality=None), which transformers' exporters and multimodal checks call."""
    model = make(name)
    encoder = model.model.encoder
    assert model.get_encoder() is encoder and model.get_encoder(modality=None) is encoder
    assert model.model.get_encoder(modality=None) is encoder
    assert model.get_encoder(modality="image") is model  # transformers' answer for a model without that encoder


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["talk", "lightconv", "rfa_doc", "talk_lm"])
def test_autocast_forward_and_backward(name, dtype):
    model = make(name)
    inputs = inputs_for(name)
    reference = model(**inputs).logits
    with torch.autocast("cpu", dtype=dtype):
        logits = model(**inputs).logits
    assert torch.isfinite(logits).all()
    assert (logits.float() - reference).norm() / reference.norm() < 0.05
    with torch.autocast("cpu", dtype=dtype), torch.no_grad():  # inference: the compiled kernels where built
        inference = model(**inputs).logits
    assert (inference.float() - reference).norm() / reference.norm() < 0.05
    model.train()
    labels = target_batch(seed=3) if name in SEQ2SEQ else inputs["input_ids"]
    with torch.autocast("cpu", dtype=dtype):
        loss = model(**{k: v for k, v in inputs.items() if k != "decoder_input_ids"}, labels=labels).loss
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", list(ALL))
def test_low_precision_weights_generate(name):
    model = make(name).to(torch.bfloat16)
    inputs = inputs_for(name)
    inputs.pop("decoder_input_ids", None)
    out = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4)
    assert out.shape[0] == 3


BAD_CONFIGS = [
    ("talk", dict(encoder_max_offsets=[1, 2, 3]), "encoder_max_offsets has 3 entries"),
    ("talk", dict(encoder_max_right_offsets=[1]), "encoder_max_right_offsets has 1 entries"),
    ("talk", dict(d_model=15), "must be divisible"),
    ("talk", dict(dropout=-0.1), "dropout"),
    ("talk", dict(offset_dropout=1.0), "offset_dropout"),
    ("talk", dict(activation_function="nope"), "activation_function"),
    ("talk", dict(encoder_layers=0), "encoder_layers"),
    ("talk", dict(decoder_max_offsets=[1, -2]), "decoder_max_offsets"),
    ("talk", dict(pad_token_id=99), "pad_token_id"),
    ("talk", dict(conv_dim=0), "conv_dim must be a positive int"),
    ("dynamic_conv", dict(conv_dim=0), "conv_dim must be a positive int"),
    ("dynamic_conv", dict(conv_type="deformable"), "conv_type"),
    ("dynamic_conv", dict(decoder_kernel_sizes=[3, 0]), "kernel sizes"),
    ("dynamic_conv", dict(decoder_conv_heads=3), "divisible"),
    ("rfa_doc", dict(sentential_gate="avg"), "sentential_gate"),
    ("rfa_doc", dict(sep_token_id=None), "sep_token_id"),
    ("rfa_doc", dict(rfa_eps=0.0), "rfa_eps"),
    ("rfa_doc", dict(rfa_eps=float("inf")), "rfa_eps must be a finite number"),
    ("rfa_doc", dict(gate_bias_init=float("nan")), "gate_bias_init must be a finite number"),
    ("rfa_doc", dict(random_feature_seed=2**64), "random_feature_seed must be an int in"),
    ("rfa_doc", dict(encoder_vocab_size=1, tie_encoder_embeddings=False), "outside the source vocabulary"),
    ("rfa_doc", dict(position_offset=-1), "position_offset must be >= 0"),
    ("talk_lm", dict(decoder_max_offsets=[1]), "decoder_max_offsets has 1 entries"),
    ("talk_lm", dict(label_smoothing=1.0), "label_smoothing must be a probability"),
    ("talk_lm", dict(decoder_heads=3), "conv_dim=16 must be divisible by decoder_heads=3"),
    ("dynamic_conv_lm", dict(weight_dropout=2.0), "weight_dropout"),
    ("dynamic_conv_lm", dict(vocab_size=0), "vocab_size must be a positive int"),
]


@pytest.mark.parametrize("name,overrides,match", BAD_CONFIGS)
def test_config_validation_names_the_field(name, overrides, match, tmp_path):
    """Whether the bad value is given to the config, as an override when a saved one is loaded, or set on a built
    config that is then saved: `validate()`, which `save_pretrained` calls before it writes config.json (as for
    LlamaConfig's head check), refuses it with the ValueError naming the field as the strict error's cause. Set on
    a built config that then builds a model, the model refuses it by the same ValueError (a changed conv_type would
    otherwise build the other architecture, a changed sentential_gate a model without its gate)."""
    from huggingface_hub.errors import StrictDataclassClassValidationError

    config_class, _, head_class, kwargs = ALL[name]
    with pytest.raises(ValueError, match=match):
        config_class(**{**kwargs, **overrides})
    config_class(**kwargs).save_pretrained(tmp_path / "good")
    with pytest.raises(ValueError, match=match):
        config_class.from_pretrained(tmp_path / "good", **overrides)
    config = config_class(**kwargs)
    config.update(overrides)
    with pytest.raises(StrictDataclassClassValidationError, match=match) as error:
        config.save_pretrained(tmp_path / "changed")
    assert isinstance(error.value.__cause__, ValueError)
    assert not (tmp_path / "changed" / "config.json").exists()
    with pytest.raises(ValueError, match=match):
        head_class(config)


def test_presets():
    from talk_hf import DynamicConvConfig, RfaDocConfig, TalkConfig, TalkLMConfig

    big = TalkConfig.from_preset("wmt-en-de-big", vocab_size=100)
    assert (big.d_model, big.encoder_heads, big.encoder_glu, big.vocab_size) == (1024, 16, True, 100)
    assert big.encoder_max_offsets == [3, 7, 15, 31, 31, 31, 31]
    assert TalkConfig.from_preset("iwslt-de-en").decoder_max_offsets == [1, 3, 7, 15, 15, 15]
    assert DynamicConvConfig.from_preset("iwslt-de-en").encoder_kernel_sizes == [3, 7, 15, 31, 31, 31, 31]
    assert RfaDocConfig.from_preset("iwslt-zh-en-nogate").sentential_gate == "none"
    assert TalkLMConfig.from_preset("lm").decoder_normalize_before
    with pytest.raises(ValueError, match="unknown preset"):
        TalkConfig.from_preset("nope")
