"""Shared test helpers: one tolerance table, a relative-error metric, random inputs, and a stopping criterion that
ends the rows of a batch at different steps."""

import torch
from transformers import StoppingCriteria

# Relative error ||a - b|| / ||b|| allowed between a kernel (or fast path) in `dtype` and a float64 reference run
# on the same (rounded) inputs.
REL_TOL = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}
DTYPES = list(REL_TOL)


def rel_err(a, b):
    a, b = a.double(), b.double()
    assert torch.isfinite(a).all(), "non-finite values in the result"
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def assert_close(a, b, dtype=torch.float64, name="output"):
    assert a.shape == b.shape, f"{name}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    err = rel_err(a, b)
    assert err <= REL_TOL[dtype], f"{name}: relative error {err:.3g} > {REL_TOL[dtype]:.3g} ({dtype})"


def offsets(*shape, dtype=torch.float64, generator=None):
    """Relative offsets in (0.05, 0.95): away from 0 and 1 so no window end sits on an integer by construction."""
    return torch.rand(*shape, dtype=torch.float64, generator=generator).mul(0.9).add(0.05).to(dtype)


def grads(fn, *inputs):
    """Output and gradients of sum(out * fixed random weights) w.r.t. every input."""
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*inputs)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(123), dtype=torch.float64).to(out.device)
    (out.double() * weights).sum().backward()
    return out.detach(), [t.grad for t in inputs]


def noncontiguous(t):
    """The same values in a strided (non-contiguous) layout."""
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    out = wide[..., ::2]
    assert not out.is_contiguous()
    return out


def transposed(t):
    """t's values in a dense layout whose last two dimensions are swapped in memory (not contiguous, no gaps)."""
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


def assert_compiled_matches(fn, *inputs):
    """torch.compile(fn, fullgraph=True) (inductor) gives fn's values and gradients. No compile caches: they key a
    graph by its ops, not by the ops' fake kernels, so a graph compiled with other fake kernels (another version of
    this package) would be reused."""
    want, want_grads = grads(fn, *inputs)
    with torch._inductor.config.patch(force_disable_caches=True):
        got, got_grads = grads(torch.compile(fn, fullgraph=True), *inputs)
    torch.testing.assert_close(got, want)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b)


class StopsAtToken(StoppingCriteria):
    """Ends a row of a batch when its last token is `token`, the others going on (generate() pads it)."""

    def __init__(self, token):
        self.token = token

    def __call__(self, input_ids, scores, **kwargs):
        return input_ids[:, -1] == self.token
