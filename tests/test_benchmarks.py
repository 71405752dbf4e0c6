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


def record_fwd_bwd_cases(module, monkeypatch):
    """[(x, cases)] of every cases() call with an x that requires a gradient (the forward+backward cases), recorded
    as the benchmark builds them."""
    recorded, cases = [], module.cases

    def recording(x, *args, **kwargs):
        fns = cases(x, *args, **kwargs)
        if x.requires_grad:
            recorded.append((x, fns))
        return fns

    monkeypatch.setattr(module, "cases", recording)
    return recorded


def test_ops_timed_fwd_bwd_accumulates_into_no_gradient(monkeypatch):
    """The timed forward+backward calls leave no .grad behind on x or on any leaf of a case: no call adds its
    gradients into an earlier call's (an accumulation that a training step, its gradients set to None, does not do)."""
    module = script("benchmark_ops")
    recorded = record_fwd_bwd_cases(module, monkeypatch)
    monkeypatch.setattr(module, "median_seconds", lambda fn, *args, **kwargs: [fn() for _ in range(3)] and 1e-3)
    args = argparse.Namespace(device="cpu", dtype="float32", batch=1, channels=8, heads=2, max_offset=3,
                              max_sdpa_length=16, warmup=0, iters=1, budget=None)
    module.measure(args, 16)
    assert len(recorded) == 1
    x, fns = recorded[0]
    assert x.grad is None
    for name, fn in fns.items():
        assert all(t.grad is None for t in tensor_inputs(fn).values()), name


def test_ops_fwd_bwd_cases_compute_the_gradients_of_a_fresh_backward_at_every_call():
    """Each forward+backward call returns the gradients of x and of every leaf that one backward from no gradients
    gives (None for a leaf the op does not read), the second call the same as the first."""
    module = script("benchmark_ops")
    x = torch.randn(1, 16, 8)
    xg = x.clone().requires_grad_()
    leaves = [xg]
    expected_cases = module.cases(xg, 2, 3, leaves)
    timed = module.fwd_bwd_cases(x, 2, 3)
    assert timed.keys() == expected_cases.keys()
    for name, fn in expected_cases.items():
        if "dropconnect" in name:  # a fresh random mask at every call
            continue
        for t in leaves:
            t.grad = None
        out = fn()
        out.backward(torch.ones_like(out))
        expected = [t.grad for t in leaves]
        for _ in range(2):
            grads = timed[name]()
            assert len(grads) == len(expected), name
            for grad, want in zip(grads, expected):
                assert (grad is None) == (want is None), name
                if want is not None:
                    torch.testing.assert_close(grad, want, msg=name)


def test_profile_kernels_fwd_bwd_calls_accumulate_into_no_gradient():
    """profile_kernels' forward+backward calls (the cases of benchmark_ops) leave no .grad on x or on a leaf."""
    module = script("profile_kernels")
    args = module.parse_args(["--batch", "1", "--channels", "8", "--heads", "2", "--length", "16", "--max_offset", "3",
                              "--ops", "talk", "rfa"])
    calls = module.profiled_calls(args, torch.randn(1, 16, 8))
    assert [label for label, _ in calls] == ["talk forward", "talk forward+backward", "rfa forward",
                                             "rfa forward+backward"]
    for label, fn in calls:
        fn()
        fn()
        leaves = inspect.getclosurevars(fn).nonlocals.get("leaves", [])
        assert all(t.grad is None for t in leaves), label
    with pytest.raises(SystemExit, match="unknown op"):
        module.profiled_calls(module.parse_args(["--ops", "nope"]), torch.randn(1, 16, 8))


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


def test_generation_int8_copies_quantize_every_linear_of_both_models_and_leave_them_fp32():
    """--int8 rows time copies of RFA-doc and Marian whose every nn.Linear is torch's dynamic int8 Linear; the
    models of the fp32 rows keep their float layers."""
    module = script("benchmark_generation")
    for model in module.models("document"):
        linears = sum(type(m) is torch.nn.Linear for m in model.modules())
        int8 = module.int8_copy(model)
        assert not any(type(m) is torch.nn.Linear for m in int8.modules())
        assert sum(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in int8.modules()) == linears > 0
        assert sum(type(m) is torch.nn.Linear for m in model.modules()) == linears


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


# ------------------------------------------------------------------------------------------ numeric options

WORK = {  # what each script runs after its arguments are parsed (profile_kernels: torch.randn, its input)
    "benchmark_ops": ["measure"],
    "benchmark_generation": ["run", "saved_rows"],
    "benchmark_training": ["layer_rows", "model_rows"],
    "profile_kernels": ["profiled_calls", "cases"],
    "profile_decoding": ["models"],
    "decoding_bound": ["models", "bandwidth_bytes_per_s"],
}
BAD_OPTIONS = [
    ("benchmark_ops", ["--iters", "0"], "--iters"),
    ("benchmark_ops", ["--warmup", "-1"], "--warmup"),
    ("benchmark_ops", ["--batch", "0"], "--batch"),
    ("benchmark_ops", ["--channels", "0"], "--channels"),
    ("benchmark_ops", ["--heads", "0"], "--heads"),
    ("benchmark_ops", ["--channels", "10", "--heads", "4"], "--channels"),
    ("benchmark_ops", ["--max_offset", "-1"], "--max_offset"),
    ("benchmark_ops", ["--lengths", "16", "0"], "--lengths"),
    ("benchmark_ops", ["--max_sdpa_length", "-1"], "--max_sdpa_length"),
    ("benchmark_ops", ["--budget", "0"], "--budget"),
    ("benchmark_generation", ["--repeats", "0"], "--repeats"),
    ("benchmark_generation", ["--sentences", "0"], "--sentences"),
    ("benchmark_generation", ["--stream_sentences", "0"], "--stream_sentences"),
    ("benchmark_generation", ["--stream_window", "0"], "--stream_window"),
    ("benchmark_generation", ["--lm_tokens", "0"], "--lm_tokens"),
    ("benchmark_generation", ["--lm_batch", "1", "0"], "--lm_batch"),
    ("benchmark_generation", ["--windows", "0"], "--windows"),
    ("benchmark_generation", ["--paper_beams", "0"], "--paper_beams"),
    ("benchmark_generation", ["--batch_scale", "0"], "--batch_scale"),
    ("benchmark_generation", ["--batch_scale", "nan"], "--batch_scale"),
    ("benchmark_ops", ["--budget", "nan"], "--budget"),
    ("benchmark_training", ["--iters", "0"], "--iters"),
    ("benchmark_training", ["--warmup", "-1"], "--warmup"),
    ("benchmark_training", ["--d_model", "0"], "--d_model"),
    ("benchmark_training", ["--layers", "0"], "--layers"),
    ("benchmark_training", ["--ffn", "0"], "--ffn"),
    ("benchmark_training", ["--heads", "0"], "--heads"),
    ("benchmark_training", ["--batch", "0"], "--batch"),
    ("benchmark_training", ["--length", "0"], "--length"),
    ("benchmark_training", ["--lengths", "0"], "--lengths"),
    ("profile_kernels", ["--iters", "0"], "--iters"),
    ("profile_kernels", ["--batch", "0"], "--batch"),
    ("profile_kernels", ["--channels", "0"], "--channels"),
    ("profile_kernels", ["--heads", "0"], "--heads"),
    ("profile_kernels", ["--channels", "10", "--heads", "4"], "--channels"),
    ("profile_kernels", ["--length", "0"], "--length"),
    ("profile_kernels", ["--max_offset", "-1"], "--max_offset"),
    ("profile_decoding", ["--window", "0"], "--window"),
    ("profile_decoding", ["--batch", "0"], "--batch"),
    ("profile_decoding", ["--num_beams", "0"], "--num_beams"),
    ("profile_decoding", ["--top", "0"], "--top"),
    ("benchmark_generation", ["--int8", "--device", "cuda"], "--int8"),
    ("decoding_bound", ["--batch_scale", "0"], "--batch_scale"),
    ("decoding_bound", ["--threads", "0"], "--threads"),
    ("decoding_bound", ["--bandwidth_mb", "0"], "--bandwidth_mb"),
]


class WorkStarted(Exception):
    pass


def stub_work(name, monkeypatch):
    """benchmarks/<name>.py with what its main runs after parsing (WORK) raising WorkStarted."""
    module = script(name)

    def work(*args, **kwargs):
        raise WorkStarted(name)

    for attribute in WORK[name]:
        monkeypatch.setattr(module, attribute, work, raising=False)
    if name == "profile_kernels":
        monkeypatch.setattr(torch, "randn", work)
    return module


@pytest.mark.parametrize("name,argv,option", BAD_OPTIONS, ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_numeric_option_out_of_range_is_a_usage_error_before_any_work(name, argv, option, monkeypatch, capsys):
    module = stub_work(name, monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert exit_info.value.code == 2
    assert option in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(WORK))
def test_default_options_pass_the_range_checks(name, monkeypatch):
    """The defaults are in range: main reaches its work."""
    with pytest.raises(WorkStarted):
        stub_work(name, monkeypatch).main([])
