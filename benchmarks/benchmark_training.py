"""Training throughput: talk_hf encoder-decoders vs the same-size transformers Marian and BART, in one process.

Each row is forward + backward, the median of timed steps after warm-up (CUDA events on GPU), in tokens/s:
  - layer rows: the LAST encoder layer (token mixer + feed-forward, with its residuals and norms; the widest window:
    DynamicConv's and LightConv's largest kernel K, TaLK's largest offsets, named in the row and saved as
    <kind>_kernel_size / talk_max_offsets) on a (batch, n, d_model) input at each --lengths n: TaLK, DynamicConv,
    LightConv vs Marian's self-attention layer (transformers' SDPA attention), tokens = batch * n, the input's
    gradient included; on CUDA <kind>_step_peak_MB is the memory a step allocates beyond the layer's weights and its
    input, at its peak (only the measured layer on the device, no gradients left from earlier steps);
  - model rows: a whole training step (forward with labels, backward, AdamW step) on --batch pairs of --length
    source and target tokens: tokens = target tokens; on CUDA <kind>_peak_MB is the step's peak allocation, the
    model's weights, gradients and optimizer state included (only that model on the device).
Ratios are against Marian's time in the same run. --amp bf16 runs under torch.autocast (the GPU setting);
CPU rows are fp32.

    python benchmarks/benchmark_training.py --device cpu --output runs/bench/training_cpu.json
    python benchmarks/benchmark_training.py --device cuda --amp bf16 --d_model 512 --layers 6 --ffn 2048 --heads 8 \\
        --batch 32 --length 128 --lengths 512 2048 8192 --output runs/bench/training_gpu.json
"""

import argparse
import contextlib

import torch

from talk_hf.training.models import build_model_for_ids, count_parameters
from talk_hf.training.plot import pyplot, save_figure
from talk_hf.training.tables import markdown_table
from timing import environment, median_seconds, require_at_least, save_results

VOCAB = 8000
IDS = dict(vocab_size=VOCAB, pad_token_id=1, bos_token_id=0, eos_token_id=2)
KINDS = ("talk", "dynamic_conv", "lightconv", "marian", "bart")


def build(kind, args):
    """A freshly initialised model of `kind` with d_model, layers, FFN width and heads from args and no dropout,
    sized as the results runners size them (talk_hf.training.models: same field names for every kind)."""
    heads = {
        "talk": dict(encoder_heads=args.heads, decoder_heads=args.heads, offset_dropout=0.0, input_dropout=0.0),
        "dynamic_conv": dict(encoder_conv_heads=args.heads, decoder_conv_heads=args.heads, weight_dropout=0.0),
        "lightconv": dict(encoder_conv_heads=args.heads, decoder_conv_heads=args.heads, weight_dropout=0.0),
        "marian": dict(encoder_attention_heads=args.heads, max_position_embeddings=max(args.lengths + [args.length])),
    }
    heads["bart"] = heads["marian"]
    size = dict(d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers, encoder_ffn_dim=args.ffn,
                decoder_ffn_dim=args.ffn, decoder_attention_heads=args.heads, dropout=0.0, attention_dropout=0.0)
    return build_model_for_ids(kind, IDS, overrides={**size, **heads[kind]})


def autocast(args, device):
    if args.amp == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def peak_memory_mb(device):
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def layer_step(layer, x, args, device):
    """forward + backward of one encoder layer (no mask: every position is a real token), the gradients of its
    parameters and of x fresh (none accumulated from an earlier step)."""
    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        with autocast(args, device):
            out = layer(x, attention_mask=None)
        out = out[0] if isinstance(out, tuple) else out
        out.float().sum().backward()
    return step


def model_step(model, batch, optimizer, args, device):
    """forward with labels + backward + AdamW step."""
    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast(args, device):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
    return step


def step_peak_mb(step, layer, x, device):
    """CUDA memory one `step()` allocates beyond what is allocated before it (the layer's weights and x; its
    gradients and x's cleared first), at its peak, in MB; None off CUDA."""
    if device.type != "cuda":
        return None
    layer.zero_grad(set_to_none=True)
    x.grad = None
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def last_encoder_layer(kind, args):
    """The last encoder layer of a fresh `kind` model, on the CPU, and what sets its window: {"kernel_size": K} for
    DynamicConv and LightConv, {"max_offsets": [left, right]} for TaLK, {} for Marian."""
    layer = build(kind, args).get_encoder().layers[-1]
    mixer = getattr(layer, "mixer", None)
    if kind == "talk":
        return layer, {"max_offsets": [mixer.max_left, mixer.max_right]}
    if kind in ("dynamic_conv", "lightconv"):
        return layer, {"kernel_size": mixer.kernel_size}
    return layer, {}


def layer_rows(args, device, generator):
    rows = []
    built = {kind: last_encoder_layer(kind, args) for kind in KINDS if kind != "bart"}
    layers = {kind: layer.train() for kind, (layer, _) in built.items()}
    windows = {f"{kind}_{name}": value for kind, (_, window) in built.items() for name, value in window.items()}
    offsets = "/".join(map(str, windows["talk_max_offsets"]))
    label = (f"encoder layer {args.layers} of {args.layers} (TaLK max offsets {offsets}, "
             f"DynamicConv K={windows['dynamic_conv_kernel_size']}, LightConv K={windows['lightconv_kernel_size']})")
    for n in args.lengths:
        x = torch.randn(args.batch, n, args.d_model, generator=generator).to(device).requires_grad_()
        row = {"row": f"{label}, n={n}", "kind": "layer", "n": n, "tokens": args.batch * n, "layer": args.layers - 1,
               **windows}
        for kind, layer in layers.items():
            layer.to(device)  # only the measured layer's weights (and gradients) on the device
            step = layer_step(layer, x, args, device)
            seconds = median_seconds(step, device, args.warmup, args.iters)
            row[f"{kind}_tokens_per_s"] = row["tokens"] / seconds
            row[f"{kind}_step_peak_MB"] = step_peak_mb(step, layer, x, device)
            layer.zero_grad(set_to_none=True)
            x.grad = None
            layer.to("cpu")
        rows.append(with_ratios(row, [k for k in layers if k != "marian"]))
    return rows


def model_rows(args, device, generator):
    ids = lambda: torch.randint(5, VOCAB, (args.batch, args.length), generator=generator).to(device)  # noqa: E731
    batch = {"input_ids": ids(), "labels": ids()}
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    row = {"row": f"training step, {args.batch} x {args.length} tokens", "kind": "model", "n": args.length,
           "tokens": args.batch * args.length}
    for kind in KINDS:
        model = build(kind, args).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        seconds = median_seconds(model_step(model, batch, optimizer, args, device), device, args.warmup, args.iters)
        row[f"{kind}_tokens_per_s"] = row["tokens"] / seconds
        row[f"{kind}_params_M"] = count_parameters(model) / 1e6
        row[f"{kind}_peak_MB"] = peak_memory_mb(device)
        del model, optimizer
    return [with_ratios(row, [k for k in KINDS if k != "marian"])]


def with_ratios(row, kinds):
    """speed-up over Marian (tokens/s ratio) for each other kind."""
    for kind in kinds:
        row[f"{kind}_over_marian"] = row[f"{kind}_tokens_per_s"] / row["marian_tokens_per_s"]
    return row


def table(rows):
    speeds = [(f"{k} tokens/s", lambda r, k=k: f"{r[f'{k}_tokens_per_s']:.0f}" if f"{k}_tokens_per_s" in r else "-")
              for k in KINDS]
    return markdown_table(rows, [("row", lambda r: r["row"]), *speeds,
                                 ("TaLK / Marian", lambda r: f"{r['talk_over_marian']:.2f}x")])


def plot(rows, path):
    """Encoder-layer training tokens/s against n for each model (log x)."""
    plt = pyplot()
    layer = [r for r in rows if r["kind"] == "layer"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for kind in KINDS:
        points = [(r["n"], r[f"{kind}_tokens_per_s"]) for r in layer if f"{kind}_tokens_per_s" in r]
        if points:
            ax.plot(*zip(*points), "o-", label=kind)
    ax.set_xscale("log")
    ax.set_xlabel("sequence length n")
    ax.set_ylabel("encoder layer forward + backward (tokens/s)")
    ax.legend()
    save_figure(fig, path)


def check_options(parser, args):
    """A usage error (exit status 2) for a size or count option out of range, before any model is built."""
    require_at_least(parser, args, 1, "d_model", "layers", "ffn", "heads", "batch", "length", "lengths", "iters")
    require_at_least(parser, args, 0, "warmup")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", choices=["none", "bf16"], default="none")
    parser.add_argument("--d_model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--ffn", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=64, help="source and target tokens per pair (model rows)")
    parser.add_argument("--lengths", type=int, nargs="*", default=[256, 1024, 4096],
                        help="layer rows (none: whole-model rows only)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--output", default=None)
    parser.add_argument("--plot", default=None, help="PNG path for a plot of the rows")
    args = parser.parse_args(argv)
    check_options(parser, args)
    device = torch.device(args.device)
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    rows = layer_rows(args, device, generator) + model_rows(args, device, generator)
    print(table(rows))
    if args.plot:
        plot(rows, args.plot)
    if args.output:
        save_results(args.output, environment(device, args), rows)
    return rows


if __name__ == "__main__":
    main()
