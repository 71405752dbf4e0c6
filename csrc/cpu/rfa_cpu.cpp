// Causal random-feature attention with a decay gate on the CPU: the recurrence of talk_hf/rfa.py
// (`rfa_causal_ref` is the specification), one (batch, head) per task, the (F, d + 1) state in the
// accumulation type (fp32 for fp32 inputs, fp64 for fp64: the Python wrapper casts activations up first).
//
// With E = d + 1 value columns (the last one is all ones, so the normaliser z rides along as column d):
//   P_t   = decay[t-1] * P_{t-1} + k_t [v_t, 1]^T      (P_{-1} = initial state, decay[-1] = 1)
//   out_t = (q_t^T P_t)[:d] / max((q_t^T P_t)[d], eps)
//   final = decay[T-1] * P_{T-1}
// The forward also writes checkpoints: entry n holds P_{n*chunk - 1} (the state before chunk n, before its
// decay; the initial state for n = 0). The backward walks the chunks in reverse, recomputes the chunk's states
// from its checkpoint into a per-task buffer, and propagates the state adjoint G_t = dL/dP_t:
//   G_t    = decay[t] * G_{t+1} + q_t g_t^T        (G_T-1 starts from decay[T-1] * grad_final)
//   dq_t   = P_t g_t,  dk_t = G_t [v_t, 1],  d[v_t, 1] = G_t^T k_t,  ddecay[t-1] = <G_t, P_{t-1}>
// where g_t is the gradient of q_t^T P_t through the normalisation. Every output element is written by one task.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../checks.h"
#include "../rfa_math.h"
#include "vector_clones.h"

namespace talk_hf {
namespace {

struct Dims {
  int64_t B, T, H, F, D, E, N, chunk;  // E = D + 1 value columns, N = number of chunks
};

// Element (b, t, h, :) of a (B, T, H, width) tensor.
template <typename T>
inline T* at_bth(T* base, const Dims& d, int64_t b, int64_t t, int64_t h, int64_t width) {
  return base + ((b * d.T + t) * d.H + h) * width;
}

// num = P^T q over the F rows of a (F, E) state.
template <typename acc_t>
inline void read_state(const acc_t* __restrict__ P, const acc_t* __restrict__ q, acc_t* __restrict__ num,
                       const Dims& d) {
  std::fill(num, num + d.E, acc_t(0));
  for (int64_t f = 0; f < d.F; ++f) {
    const acc_t qf = q[f];
    const acc_t* __restrict__ row = P + f * d.E;
#pragma omp simd
    for (int64_t e = 0; e < d.E; ++e) num[e] += qf * row[e];
  }
}

// dst = scale * src + k [v, 1]^T
// (src may be dst: each element is read once, then written)
template <typename acc_t>
inline void advance_state(const acc_t* src, acc_t scale, const acc_t* __restrict__ k, const acc_t* __restrict__ v,
                          acc_t* dst, const Dims& d) {
  for (int64_t f = 0; f < d.F; ++f) {
    const acc_t kf = k[f];
    const acc_t* s = src + f * d.E;
    acc_t* r = dst + f * d.E;
#pragma omp simd
    for (int64_t e = 0; e < d.D; ++e) r[e] = scale * s[e] + kf * v[e];
    r[d.D] = scale * s[d.D] + kf;
  }
}

// Forward of one (batch, head).
template <typename acc_t>
TALK_HF_VECTOR_CLONES void forward_task(const acc_t* q, const acc_t* k, const acc_t* v, const acc_t* decay,
                                        const acc_t* init, acc_t eps, acc_t* out, acc_t* state, acc_t* checkpoints,
                                        const Dims& d, int64_t bh, acc_t* num) {
  const int64_t S = d.F * d.E;
  const int64_t b = bh / d.H, h = bh % d.H;
  acc_t* P = state + bh * S;
  if (!init) std::fill(P, P + S, acc_t(0));
  else if (init != state) std::copy(init + bh * S, init + (bh + 1) * S, P);  // same buffer: advanced in place
  acc_t scale = 1;  // decay of the previous step, applied when the next key is added
  for (int64_t t = 0; t < d.T; ++t) {
    if (d.chunk > 0 && t % d.chunk == 0) std::copy(P, P + S, checkpoints + (bh * d.N + t / d.chunk) * S);
    advance_state(P, scale, at_bth(k, d, b, t, h, d.F), at_bth(v, d, b, t, h, d.D), P, d);
    read_state(P, at_bth(q, d, b, t, h, d.F), num, d);
    const acc_t den = std::max(num[d.D], eps);
    acc_t* o = at_bth(out, d, b, t, h, d.D);
    for (int64_t e = 0; e < d.D; ++e) o[e] = num[e] / den;
    scale = decay ? decay[(b * d.T + t) * d.H + h] : acc_t(1);
  }
  if (scale != acc_t(1)) std::transform(P, P + S, P, [scale](acc_t x) { return x * scale; });
}

template <typename acc_t>
void forward_kernel(const acc_t* q, const acc_t* k, const acc_t* v, const acc_t* decay, const acc_t* init,
                    acc_t eps, acc_t* out, acc_t* state, acc_t* checkpoints, const Dims& d) {
  at::parallel_for(0, d.B * d.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> num(d.E);
    for (int64_t bh = begin; bh < end; ++bh)
      forward_task(q, k, v, decay, init, eps, out, state, checkpoints, d, bh, num.data());
  });
}

template <typename acc_t>
struct Grads {
  acc_t *q, *k, *v, *decay, *init;
};

// One step of the reverse sweep, row by row of the state: G += q g^T (G becomes dL/dP_t); dq = P g, dk = G [v, 1],
// dv += G^T k (D columns), ddecay = <G, P_{t-1}> (returned); then G *= scale (dL/dP_{t-1} through P_t).
template <typename acc_t>
inline acc_t reverse_step(acc_t* __restrict__ G, const acc_t* __restrict__ P, const acc_t* __restrict__ prev,
                          const acc_t* __restrict__ qt, const acc_t* __restrict__ kt, const acc_t* __restrict__ vt,
                          const acc_t* __restrict__ g, acc_t scale, acc_t* __restrict__ gq, acc_t* __restrict__ gk,
                          acc_t* __restrict__ gv, const Dims& d) {
  const int64_t D = d.D;
  std::fill(gv, gv + D, acc_t(0));
  acc_t gdecay = 0;
  for (int64_t f = 0; f < d.F; ++f) {
    acc_t* __restrict__ Gr = G + f * d.E;
    const acc_t* __restrict__ Pr = P + f * d.E;
    const acc_t* __restrict__ prevr = prev + f * d.E;
    const acc_t qf = qt[f], kf = kt[f];
    acc_t dq = 0, dk = 0, gd = 0;
#pragma omp simd reduction(+ : dq, dk, gd)
    for (int64_t e = 0; e < D; ++e) {
      const acc_t Ge = Gr[e] + qf * g[e];
      dq += Pr[e] * g[e];
      dk += Ge * vt[e];
      gv[e] += Ge * kf;
      gd += Ge * prevr[e];
      Gr[e] = Ge * scale;
    }
    const acc_t Gz = Gr[D] + qf * g[D];  // the normaliser column: v = 1
    dq += Pr[D] * g[D];
    dk += Gz;
    gd += Gz * prevr[D];
    Gr[D] = Gz * scale;
    gq[f] = dq;
    gk[f] = dk;
    gdecay += gd;
  }
  return gdecay;
}

// Backward of one (batch, head); G, states, num, g are scratch of S, (chunk + 1) * S, E and E accumulators.
template <typename acc_t>
TALK_HF_VECTOR_CLONES void backward_task(const acc_t* go, const acc_t* gfinal, const acc_t* q, const acc_t* k,
                                         const acc_t* v, const acc_t* decay, const acc_t* checkpoints, acc_t eps,
                                         Grads<acc_t> grad, const Dims& d, int64_t bh, acc_t* G, acc_t* states,
                                         acc_t* num, acc_t* g) {
  const int64_t S = d.F * d.E;
  const int64_t b = bh / d.H, h = bh % d.H;
  auto decay_at = [&](int64_t t) { return decay ? decay[(b * d.T + t) * d.H + h] : acc_t(1); };
  std::fill(G, G + S, acc_t(0));
  for (int64_t n = d.N - 1; n >= 0; --n) {
    const int64_t t0 = n * d.chunk, t1 = std::min(d.T, t0 + d.chunk);
    // states[0] = P_{t0-1}; states[i + 1] = P_{t0+i}
    std::copy(checkpoints + (bh * d.N + n) * S, checkpoints + (bh * d.N + n + 1) * S, states);
    for (int64_t t = t0; t < t1; ++t) {
      advance_state(states + (t - t0) * S, t > 0 ? decay_at(t - 1) : acc_t(1), at_bth(k, d, b, t, h, d.F),
                    at_bth(v, d, b, t, h, d.D), states + (t - t0 + 1) * S, d);
    }
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const acc_t* P = states + (t - t0 + 1) * S;
      if (t == d.T - 1 && gfinal) {  // final = decay[T-1] * P_{T-1}
        const acc_t* gf = gfinal + bh * S;
        acc_t dot = 0;
        for (int64_t i = 0; i < S; ++i) dot += gf[i] * P[i];
        if (decay) grad.decay[(b * d.T + t) * d.H + h] = dot;
        const acc_t scale = decay_at(t);
        for (int64_t i = 0; i < S; ++i) G[i] = scale * gf[i];
      } else if (t == d.T - 1 && decay) {
        grad.decay[(b * d.T + t) * d.H + h] = 0;
      }
      const acc_t* qt = at_bth(q, d, b, t, h, d.F);
      read_state(P, qt, num, d);
      rfa_normalise_backward(num, at_bth(go, d, b, t, h, d.D), eps, g, d.D);
      const acc_t gdecay = reverse_step(G, P, P - S, qt, at_bth(k, d, b, t, h, d.F), at_bth(v, d, b, t, h, d.D), g,
                                        t > 0 ? decay_at(t - 1) : acc_t(1), at_bth(grad.q, d, b, t, h, d.F),
                                        at_bth(grad.k, d, b, t, h, d.F), at_bth(grad.v, d, b, t, h, d.D), d);
      if (t > 0 && decay) grad.decay[(b * d.T + t - 1) * d.H + h] = gdecay;
    }
  }
  if (grad.init) std::copy(G, G + S, grad.init + bh * S);
}

template <typename acc_t>
void backward_kernel(const acc_t* go, const acc_t* gfinal, const acc_t* q, const acc_t* k, const acc_t* v,
                     const acc_t* decay, const acc_t* checkpoints, acc_t eps, Grads<acc_t> grad, const Dims& d) {
  const int64_t S = d.F * d.E;
  at::parallel_for(0, d.B * d.H, 1, [&](int64_t begin, int64_t end) {
    // a chunk longer than the sequence replays at most T steps: room for those, whatever chunk_size asked
    std::vector<acc_t> G(S), states((std::min(d.chunk, d.T) + 1) * S), num(d.E), g(d.E);
    for (int64_t bh = begin; bh < end; ++bh)
      backward_task(go, gfinal, q, k, v, decay, checkpoints, eps, grad, d, bh, G.data(), states.data(), num.data(),
                    g.data());
  });
}

Dims make_dims(const at::Tensor& q, const at::Tensor& v, int64_t chunk) {
  const int64_t T = q.size(1);
  return {q.size(0), T, q.size(2), q.size(3), v.size(3), v.size(3) + 1, rfa_num_chunks(T, chunk), chunk};
}

template <typename T>
T* ptr_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rfa_causal_fwd_cpu(const at::Tensor& q_, const at::Tensor& k_,
                                                                  const at::Tensor& v_,
                                                                  const c10::optional<at::Tensor>& decay_,
                                                                  const c10::optional<at::Tensor>& init_, double eps,
                                                                  int64_t chunk, bool /*tf32: CUDA only*/) {
  check_rfa_inputs(q_, k_, v_, decay_, init_, chunk);
  const at::Tensor q = q_.contiguous(), k = k_.contiguous(), v = v_.contiguous();
  const at::Tensor decay = contiguous_or_undefined(decay_);
  const at::Tensor init = contiguous_or_undefined(init_);
  const Dims d = make_dims(q, v, chunk);
  at::Tensor out = at::empty({d.B, d.T, d.H, d.D}, v.options());
  at::Tensor state = at::empty({d.B, d.H, d.F, d.E}, v.options());
  at::Tensor checkpoints = at::empty({d.B, d.H, d.N, d.F, d.E}, v.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "rfa_causal_fwd_cpu", [&] {
    forward_kernel<scalar_t>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                             ptr_or_null<scalar_t>(decay), ptr_or_null<scalar_t>(init), static_cast<scalar_t>(eps),
                             out.data_ptr<scalar_t>(), state.data_ptr<scalar_t>(), checkpoints.data_ptr<scalar_t>(),
                             d);
  });
  return {out, state, checkpoints};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rfa_causal_bwd_cpu(
    const at::Tensor& go_, const c10::optional<at::Tensor>& gfinal_, const at::Tensor& q_, const at::Tensor& k_,
    const at::Tensor& v_, const c10::optional<at::Tensor>& decay_, const c10::optional<at::Tensor>& init_,
    const at::Tensor& checkpoints_, double eps, int64_t chunk, bool /*tf32: CUDA only*/) {
  check_rfa_inputs(q_, k_, v_, decay_, init_, chunk);
  const Dims d = make_dims(q_, v_, chunk);
  check_rfa_backward_inputs(go_, gfinal_, checkpoints_, q_, v_, chunk);
  const at::Tensor go = go_.contiguous(), q = q_.contiguous(), k = k_.contiguous(), v = v_.contiguous();
  const at::Tensor gfinal = contiguous_or_undefined(gfinal_);
  const at::Tensor decay = contiguous_or_undefined(decay_);
  const at::Tensor checkpoints = checkpoints_.contiguous();
  at::Tensor gq = at::empty_like(q), gk = at::empty_like(k), gv = at::empty_like(v);
  at::Tensor gdecay = decay.defined() ? at::empty_like(decay) : at::empty({0}, q.options());
  at::Tensor ginit = init_.has_value() ? at::empty({d.B, d.H, d.F, d.E}, q.options()) : at::empty({0}, q.options());
  if (d.T == 0) {  // final state = initial state
    if (ginit.numel()) gfinal.defined() ? ginit.copy_(gfinal) : ginit.zero_();
    return {gq, gk, gv, gdecay, ginit};
  }
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "rfa_causal_bwd_cpu", [&] {
    Grads<scalar_t> grad{gq.data_ptr<scalar_t>(), gk.data_ptr<scalar_t>(), gv.data_ptr<scalar_t>(),
                         ptr_or_null<scalar_t>(gdecay.numel() ? gdecay : at::Tensor()),
                         ptr_or_null<scalar_t>(ginit.numel() ? ginit : at::Tensor())};
    backward_kernel<scalar_t>(go.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(gfinal), q.data_ptr<scalar_t>(),
                              k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(decay),
                              checkpoints.data_ptr<scalar_t>(), static_cast<scalar_t>(eps), grad, d);
  });
  return {gq, gk, gv, gdecay, ginit};
}

// Decoding step(s): `state` is the initial state and receives the final one (no copy, no checkpoints).
at::Tensor rfa_causal_step_cpu(const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_,
                               const c10::optional<at::Tensor>& decay_, at::Tensor& state, double eps) {
  check_rfa_inputs(q_, k_, v_, decay_, state, 0, "rfa_causal_step_", "state");
  check_in_place_state(state);
  const at::Tensor q = q_.contiguous(), k = k_.contiguous(), v = v_.contiguous();
  const at::Tensor decay = contiguous_or_undefined(decay_);
  const Dims d = make_dims(q, v, 0);
  at::Tensor out = at::empty({d.B, d.T, d.H, d.D}, v.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "rfa_causal_step_cpu", [&] {
    forward_kernel<scalar_t>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                             ptr_or_null<scalar_t>(decay), state.data_ptr<scalar_t>(), static_cast<scalar_t>(eps),
                             out.data_ptr<scalar_t>(), state.data_ptr<scalar_t>(), nullptr, d);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(talk_hf, CPU, m) {
  m.impl("rfa_causal_fwd", &rfa_causal_fwd_cpu);
  m.impl("rfa_causal_bwd", &rfa_causal_bwd_cpu);
  m.impl("rfa_causal_step_", &rfa_causal_step_cpu);
}

}  // namespace talk_hf
