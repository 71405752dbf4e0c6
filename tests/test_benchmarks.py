"""The benchmark scripts measure what they say: both sides of each comparison do the same work (the same gradients,
the same source tokens), the timed layer is the one named, nothing is reused or written that was not asked for.
Tiny sizes, CPU only (tests/training/test_scripts.py runs every script end to end)."""

import argparse
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest
import torch


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def script(name):
    """benchmarks/<name>.py imported as a module, its folder on sys.path while it loads (as when it runs)."""
    path = BENCHMARKS / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def tiny_paper_benchmark(monkeypatch):
    """benchmark_generation with the "paper" models at one layer of width 16."""
    module = script("benchmark_generation")
    monkeypatch.setattr(module, "PAPER_SIZE", dict(d_model=16, layers=1, heads=2, ffn=32))
    return module


def tensor_inputs(fn):
    """name -> tensor of the floating-point tensors a case's closure reads."""
    closure = inspect.getclosurevars(fn).nonlocals
    return {k: v for k, v in closure.items() if isinstance(v, torch.Tensor) and v.is_floating_point()}


# ------------------------------------------------------------------------------------------ benchmark_ops


def test_ops_fwd_bwd_cases_differentiate_every_input_that_training_does():
    """In the forward+backward cases every input with a gradient in training requires one (RFA's q/k features and
    decay, TaLK's offsets, DynamicConv's weights), so the compiled RFA kernel's backward (which always computes the
    q, k and decay gradients) is timed against a chunked form that computes them too; the forward cases' inputs
    require none and are the same values."""
    module = script("benchmark_ops")
    x = torch.randn(1, 16, 8)
    xg = x.clone().requires_grad_()
    forward, with_grad = module.cases(x, 2, 3), module.cases(xg, 2, 3)
    assert forward.keys() == with_grad.keys()
    expected = {"talk": {"ol", "orr"}, "talk_ref": {"ol", "orr"}, "dynamic_conv_k3": {"w3"},
                "dynamic_conv_k31": {"w31"}, "rfa": {"phi", "decay"}, "rfa_chunked": {"phi", "decay"}}
    for name, fn in with_grad.items():
        inputs = {k: v for k, v in tensor_inputs(fn).items() if k != "x"}
        assert expected.get(name, set()) <= inputs.keys(), name
        assert all(t.requires_grad for t in inputs.values()), name
        for t in inputs.values():
            t.grad = None
        xg.grad = None
        out = fn()
        out.backward(torch.ones_like(out))
        assert xg.grad is not None, name
        assert all(t.grad is not None for t in inputs.values()), name
        assert not any(t.requires_grad for t in tensor_inputs(forward[name]).values()), name
        if "dropconnect" not in name:  # the same inputs: the same output
            torch.testing.assert_close(forward[name](), fn().detach(), msg=name)


# ------------------------------------------------------------------------------------------ benchmark_generation


def test_generation_sources_end_with_eos_for_every_model():
    """A translation source ends with </s> as Marian's tokenizer ends it, and CTranslate2 reads the same tokens;
    language-model prompts are words alone."""
    module = script("benchmark_generation")
    g = torch.Generator().manual_seed(0)
    inputs = module.source(3, 20, "cpu", g)
    assert inputs["input_ids"].shape == (3, 21) and (inputs["input_ids"][:, -1] == module.EOS).all()
    assert inputs["attention_mask"].shape == (3, 21)
    ct2 = module.ctranslate2_sources(inputs)
    assert [len(row) for row in ct2] == [21] * 3 and all(row[-1] == "</s>" for row in ct2)
    words = [" ".join(row[:-1]) for row in ct2]
    assert module.word_tokenizer()(words)["input_ids"] == inputs["input_ids"].tolist()
    prompt = module.source(2, 16, "cpu", g, eos=False)["input_ids"]
    assert prompt.shape == (2, 16) and not (prompt == module.EOS).any()
    with pytest.raises(ValueError):
        module.ctranslate2_sources({"input_ids": prompt})


def test_ctranslate2_conversion_of_other_weights_is_not_reused(tmp_path):
    module = script("benchmark_generation")
    values = dict(module.SEQ2SEQ, d_model=16, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32,
                  decoder_ffn_dim=32, decoder_attention_heads=2)
    torch.manual_seed(0)
    first = module.marian(values, 2).eval()
    torch.manual_seed(1)
    second = module.marian(values, 2).eval()
    folder = tmp_path / "ct2"
    model_bin = folder / "ct2-float32" / "model.bin"
    module.ctranslate2_translator(first, folder, "float32")
    converted = model_bin.read_bytes()
    module.ctranslate2_translator(first, folder, "float32")  # the same model (saved since): kept
    assert model_bin.read_bytes() == converted
    assert module.model_fingerprint(first) == (folder / "ct2-float32.sha256").read_text()
    module.ctranslate2_translator(second, folder, "float32")  # other weights: converted again
    assert model_bin.read_bytes() != converted
    assert module.model_fingerprint(second) == (folder / "ct2-float32.sha256").read_text()
    reloaded = module.ctranslate2_translator(None, folder, "float32")
    fresh = module.ctranslate2_translator(second, tmp_path / "fresh", "float32")
    sources = module.ctranslate2_sources(module.source(2, 5, "cpu", torch.Generator().manual_seed(0)))
    kwargs = dict(beam_size=1, min_decoding_length=6, max_decoding_length=6)
    assert ([r.hypotheses for r in reloaded.translate_batch(sources, **kwargs)]
            == [r.hypotheses for r in fresh.translate_batch(sources, **kwargs)])
    with pytest.raises(FileNotFoundError):
        module.ctranslate2_translator(None, tmp_path / "empty", "float32")


def test_generation_streaming_rows_take_the_median_of_repeats_and_synchronize(monkeypatch):
    module = tiny_paper_benchmark(monkeypatch)
    documents, synchronized = [], []
    sentence_times, synchronize = module._sentence_times, module.synchronize
    monkeypatch.setattr(module, "_sentence_times", lambda model, run: documents.append(model) or sentence_times(
        model, run))
    monkeypatch.setattr(module, "synchronize", lambda device: synchronized.append(str(device)) or synchronize(device))
    rows = module.main(["--rows", "streaming", "--stream_sentences", "2", "--stream_window", "2", "--repeats", "2"])
    assert len(rows) == 3 and all(r["repeats"] == 2 and r["tokens_per_s"] > 0 for r in rows)
    assert len(documents) == 3 * 2  # each row's document translated --repeats times
    assert synchronized and set(synchronized) == {"cpu"}  # a clock read after each generate() syncs its device


# ------------------------------------------------------------------------------------------ benchmark_training


def test_training_layer_rows_time_the_last_layer_and_name_its_window():
    module = script("benchmark_training")
    rows = module.main(["--d_model", "16", "--layers", "2", "--ffn", "32", "--heads", "2", "--batch", "2",
                        "--length", "8", "--lengths", "8", "--iters", "1", "--warmup", "0"])
    layer = rows[0]
    args = argparse.Namespace(d_model=16, layers=2, ffn=32, heads=2, lengths=[8], length=8)
    talk, conv = module.build("talk", args).config, module.build("dynamic_conv", args).config
    assert layer["kind"] == "layer" and layer["layer"] == 1
    assert layer["talk_max_offsets"] == [talk.encoder_max_offsets[-1], talk.encoder_max_right_offsets[-1]]
    assert layer["dynamic_conv_kernel_size"] == conv.encoder_kernel_sizes[-1] == max(conv.encoder_kernel_sizes)
    assert f"K={conv.encoder_kernel_sizes[-1]}" in layer["row"]
    assert all(layer[f"{kind}_step_peak_MB"] is None for kind in ("talk", "dynamic_conv", "lightconv", "marian"))


def test_training_layer_step_starts_from_no_gradients():
    """Each timed step computes the input's and the parameters' gradients afresh: none accumulated (and none of an
    earlier step counted in a peak)."""
    module = script("benchmark_training")
    args = argparse.Namespace(d_model=16, layers=1, ffn=32, heads=2, lengths=[8], length=8, amp="none")
    layer = module.build("talk", args).get_encoder().layers[-1].train()
    x = torch.randn(2, 8, 16, requires_grad=True)
    params = list(layer.parameters())
    out = layer(x, attention_mask=None)
    expected = torch.autograd.grad((out[0] if isinstance(out, tuple) else out).float().sum(), [x, *params])
    step = module.layer_step(layer, x, args, torch.device("cpu"))
    for t in (x, *params):  # gradients left by an earlier step
        t.grad = torch.full_like(t, 100.0)
    step()
    for t, grad in zip((x, *params), expected):
        torch.testing.assert_close(t.grad, grad)
    assert module.step_peak_mb(step, layer, x, torch.device("cpu")) is None


# ------------------------------------------------------------------------------------------ decoding_bound


def test_decoding_bound_writes_no_file_without_output(tmp_path, monkeypatch):
    module = script("decoding_bound")
    monkeypatch.setattr(module, "models", tiny_paper_benchmark(monkeypatch).models)
    monkeypatch.chdir(tmp_path)
    rows = module.main(["--windows", "1", "--batch_scale", "0.01", "--bandwidth_mb", "8"])
    assert rows and not list(tmp_path.iterdir())
    module.main(["--windows", "1", "--batch_scale", "0.01", "--bandwidth_mb", "8", "--output", "b.json"])
    assert [p.name for p in tmp_path.iterdir()] == ["b.json"]
