"""Helpers of the RFA-doc and TaLK converter tests: fairseq 0.10-style release folders written from state dicts in the
extensions' exact checkpoint layout (fairseq's save_state fields, an args Namespace, dict.<lang>.txt files), and the
plain float64 pieces (linear, layer norm, fairseq's sinusoidal positions) the tests' reference forwards are built
from. Everything here is time-major where fairseq is: activations (T, B, C)."""

import argparse
import math

import torch
import torch.nn.functional as F

SOURCE_LANG, TARGET_LANG = "zh", "en"
PAD, EOS = 1, 2


def write_dictionary(path, words):
    """A fairseq dict.<lang>.txt with `words` entries ("w<i> <count>")."""
    path.write_text("".join(f"w{i} {1000 - i}\n" for i in range(words)), encoding="utf-8")


def fairseq_tokenizer(folder, source_text, target_text=None, **kwargs):
    """A FairseqMosesBpeTokenizer without BPE codes (input split on spaces) on dictionaries of these lines
    (dict.src.txt, dict.tgt.txt written in `folder`); kwargs go to the tokenizer (e.g. sep_token)."""
    from talk_hf.tokenization_fairseq import FairseqMosesBpeTokenizer

    (folder / "dict.src.txt").write_text(source_text, encoding="utf-8")
    (folder / "dict.tgt.txt").write_text(target_text or source_text, encoding="utf-8")
    return FairseqMosesBpeTokenizer(str(folder / "dict.src.txt"), str(folder / "dict.tgt.txt"), **kwargs)


def fairseq_checkpoint(args, model_state):
    """The dict fairseq 0.10's checkpoint_utils.save_state writes (args, model, optimizer history, extra state,
    optimizer state)."""
    return {
        "args": args,
        "model": model_state,
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": 3.0}, "num_updates": 1000}],
        "extra_state": {"train_iterator": {"epoch": 3, "iterations_in_epoch": 0}, "val_loss": 3.0},
        "last_optimizer_state": {"state": {}, "param_groups": [{"lr": 1e-3, "params": []}]},
    }


def write_release(folder, args, model_state, source_words, target_words):
    """model.pt (torch.save of fairseq_checkpoint) and the two dictionaries -> folder."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(fairseq_checkpoint(argparse.Namespace(**vars(args)), model_state), folder / "model.pt")
    write_dictionary(folder / f"dict.{SOURCE_LANG}.txt", source_words)
    write_dictionary(folder / f"dict.{TARGET_LANG}.txt", target_words)
    return folder


def randn(generator, *shape, scale=1.0):
    return torch.randn(*shape, generator=generator, dtype=torch.float64) * scale


def linear_params(state, prefix, n_out, n_in, generator, scale=None):
    """prefix.weight (out, in) and prefix.bias (out,) with N(0, scale^2) entries (default 1/sqrt(in))."""
    scale = n_in**-0.5 if scale is None else scale
    state[f"{prefix}.weight"] = randn(generator, n_out, n_in, scale=scale)
    state[f"{prefix}.bias"] = randn(generator, n_out, scale=0.1)


def norm_params(state, prefix, dim, generator):
    state[f"{prefix}.weight"] = 1 + randn(generator, dim, scale=0.1)
    state[f"{prefix}.bias"] = randn(generator, dim, scale=0.1)


def linear(state, prefix, x):
    return F.linear(x, state[f"{prefix}.weight"].double(), state[f"{prefix}.bias"].double())


def layer_norm(state, prefix, x):
    return F.layer_norm(x, x.shape[-1:], state[f"{prefix}.weight"].double(), state[f"{prefix}.bias"].double())


def fairseq_positions(tokens, dim, pad=PAD):
    """fairseq's SinusoidalPositionalEmbedding of (B, T) tokens: positions pad + 1, pad + 2, ... over non-pad tokens
    (make_positions), [sin | cos] halves, zero rows at pads -> (B, T, dim) float64."""
    mask = tokens.ne(pad).long()
    positions = torch.cumsum(mask, dim=1) * mask + pad
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000) / (half - 1)))
    angles = positions.double().unsqueeze(-1) * freqs
    emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    return emb * mask.unsqueeze(-1)


def embed(state, prefix, tokens, dim):
    """fairseq's scaled token embedding plus positions, time-major -> (T, B, dim)."""
    x = math.sqrt(dim) * F.embedding(tokens, state[f"{prefix}.embed_tokens.weight"].double())
    return (x + fairseq_positions(tokens, dim)).transpose(0, 1)


def softmax_attention(state, prefix, query, memory, key_padding_mask, heads):
    """fairseq's MultiheadAttention (q/k/v/out_proj, q scaled by head_dim^-1/2), time-major (T, B, C) query and
    (S, B, C) memory; key_padding_mask (B, S), True at pads -> (T, B, C)."""
    T, B, C = query.shape
    d = C // heads
    q = linear(state, f"{prefix}.q_proj", query).view(T, B, heads, d) * d**-0.5
    k = linear(state, f"{prefix}.k_proj", memory).view(-1, B, heads, d)
    v = linear(state, f"{prefix}.v_proj", memory).view(-1, B, heads, d)
    scores = torch.einsum("tbhd,sbhd->bhts", q, k)
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    out = torch.einsum("bhts,sbhd->tbhd", scores.softmax(-1), v).reshape(T, B, C)
    return linear(state, f"{prefix}.out_proj", out)


def left_padded(rows):
    """(1, L_i) token rows -> (B, max L_i), padded on the left with PAD."""
    width = max(r.shape[1] for r in rows)
    return torch.cat([F.pad(r, (width - r.shape[1], 0), value=PAD) for r in rows])


def relative_error(reference, result, mask=None):
    """max over positions of |result - reference| / |reference| (norms over the last dimension)."""
    errors = (result - reference).norm(dim=-1) / reference.norm(dim=-1)
    return (errors[mask] if mask is not None else errors).max().item()


def converted_state(folder):
    """The tensors of a converted folder's model.safetensors -> {name: tensor}."""
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))
