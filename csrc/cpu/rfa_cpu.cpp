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
void read_state(const acc_t* P, const acc_t* q, acc_t* num, const Dims& d) {
  std::fill(num, num + d.E, acc_t(0));
  for (int64_t f = 0; f < d.F; ++f) {
    const acc_t qf = q[f];
    const acc_t* row = P + f * d.E;
    for (int64_t e = 0; e < d.E; ++e) num[e] += qf * row[e];
  }
}

// dst = scale * src + k [v, 1]^T
template <typename acc_t>
void advance_state(const acc_t* src, acc_t scale, const acc_t* k, const acc_t* v, acc_t* dst, const Dims& d) {
  for (int64_t f = 0; f < d.F; ++f) {
    const acc_t kf = k[f];
    const acc_t* s = src + f * d.E;
    acc_t* r = dst + f * d.E;
    for (int64_t e = 0; e < d.D; ++e) r[e] = scale * s[e] + kf * v[e];
    r[d.D] = scale * s[d.D] + kf;
  }
}

template <typename acc_t>
void forward_kernel(const acc_t* q, const acc_t* k, const acc_t* v, const acc_t* decay, const acc_t* init,
                    acc_t eps, acc_t* out, acc_t* state, acc_t* checkpoints, const Dims& d) {
  const int64_t S = d.F * d.E;
  at::parallel_for(0, d.B * d.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> num(d.E);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / d.H, h = bh % d.H;
      acc_t* P = state + bh * S;
      if (init) std::copy(init + bh * S, init + (bh + 1) * S, P);
      else std::fill(P, P + S, acc_t(0));
      acc_t scale = 1;  // decay of the previous step, applied when the next key is added
      for (int64_t t = 0; t < d.T; ++t) {
        if (d.chunk > 0 && t % d.chunk == 0) std::copy(P, P + S, checkpoints + (bh * d.N + t / d.chunk) * S);
        advance_state(P, scale, at_bth(k, d, b, t, h, d.F), at_bth(v, d, b, t, h, d.D), P, d);
        read_state(P, at_bth(q, d, b, t, h, d.F), num.data(), d);
        const acc_t den = std::max(num[d.D], eps);
        acc_t* o = at_bth(out, d, b, t, h, d.D);
        for (int64_t e = 0; e < d.D; ++e) o[e] = num[e] / den;
        scale = decay ? decay[(b * d.T + t) * d.H + h] : acc_t(1);
      }
      if (scale != acc_t(1)) std::transform(P, P + S, P, [scale](acc_t x) { return x * scale; });
    }
  });
}

template <typename acc_t>
struct Grads {
  acc_t *q, *k, *v, *decay, *init;
};

template <typename acc_t>
void backward_kernel(const acc_t* go, const acc_t* gfinal, const acc_t* q, const acc_t* k, const acc_t* v,
                     const acc_t* decay, const acc_t* checkpoints, acc_t eps, Grads<acc_t> grad, const Dims& d) {
  const int64_t S = d.F * d.E;
  at::parallel_for(0, d.B * d.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> G(S), states((d.chunk + 1) * S), num(d.E), g(d.E), gvv(d.E);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / d.H, h = bh % d.H;
      auto decay_at = [&](int64_t t) { return decay ? decay[(b * d.T + t) * d.H + h] : acc_t(1); };
      std::fill(G.begin(), G.end(), acc_t(0));
      for (int64_t n = d.N - 1; n >= 0; --n) {
        const int64_t t0 = n * d.chunk, t1 = std::min(d.T, t0 + d.chunk);
        // states[0] = P_{t0-1}; states[i + 1] = P_{t0+i}
        std::copy(checkpoints + (bh * d.N + n) * S, checkpoints + (bh * d.N + n + 1) * S, states.data());
        for (int64_t t = t0; t < t1; ++t) {
          advance_state(states.data() + (t - t0) * S, t > 0 ? decay_at(t - 1) : acc_t(1),
                        at_bth(k, d, b, t, h, d.F), at_bth(v, d, b, t, h, d.D), states.data() + (t - t0 + 1) * S, d);
        }
        for (int64_t t = t1 - 1; t >= t0; --t) {
          const acc_t* P = states.data() + (t - t0 + 1) * S;
          const acc_t* prev = P - S;
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
          const acc_t* kt = at_bth(k, d, b, t, h, d.F);
          const acc_t* vt = at_bth(v, d, b, t, h, d.D);
          read_state(P, qt, num.data(), d);
          rfa_normalise_backward(num.data(), at_bth(go, d, b, t, h, d.D), eps, g.data(), d.D);
          acc_t* gq = at_bth(grad.q, d, b, t, h, d.F);
          acc_t* gk = at_bth(grad.k, d, b, t, h, d.F);
          std::fill(gvv.begin(), gvv.end(), acc_t(0));
          const acc_t scale = t > 0 ? decay_at(t - 1) : acc_t(1);
          acc_t gdecay = 0;
          for (int64_t f = 0; f < d.F; ++f) {
            acc_t* Gr = G.data() + f * d.E;
            const acc_t* Pr = P + f * d.E;
            const acc_t* prevr = prev + f * d.E;
            const acc_t qf = qt[f], kf = kt[f];
            acc_t dq = 0, dk = 0;
            for (int64_t e = 0; e < d.E; ++e) {
              Gr[e] += qf * g[e];  // G is now dL/dP_t
              dq += Pr[e] * g[e];
              dk += Gr[e] * (e < d.D ? vt[e] : acc_t(1));
              gvv[e] += Gr[e] * kf;
              gdecay += Gr[e] * prevr[e];
              Gr[e] *= scale;  // dL/dP_{t-1} through P_t
            }
            gq[f] = dq;
            gk[f] = dk;
          }
          std::copy(gvv.begin(), gvv.begin() + d.D, at_bth(grad.v, d, b, t, h, d.D));
          if (t > 0 && decay) grad.decay[(b * d.T + t - 1) * d.H + h] = gdecay;
        }
      }
      if (grad.init) std::copy(G.begin(), G.end(), grad.init + bh * S);
    }
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
                                                                  int64_t chunk) {
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
    const at::Tensor& checkpoints_, double eps, int64_t chunk) {
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

}  // namespace

TORCH_LIBRARY_IMPL(talk_hf, CPU, m) {
  m.impl("rfa_causal_fwd", &rfa_causal_fwd_cpu);
  m.impl("rfa_causal_bwd", &rfa_causal_bwd_cpu);
}

}  // namespace talk_hf
