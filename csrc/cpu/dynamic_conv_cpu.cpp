// Dynamic / lightweight convolution on the CPU, any kernel size K and any left padding P.
// Every output is a gather (no scatter): out and grad_x loop over taps of one position, grad_weight is a dot
// product over a head's channels, so each element is written once by one task. Sums accumulate in the
// accumulation type (fp64 for fp64, fp32 otherwise). With softmax=true the weights are logits, normalised here
// (softmax_rows_cpu.h) one position at a time, and DropConnect's factors (csrc/dropconnect.h) are drawn here too:
// the forward works out each position's taps once and writes none; the backward keeps (B, T, H, K) tables in the
// accumulation type: the probabilities, and with DropConnect its factors and the taps (their products, for grad_x).
// Specification: talk_hf/dynamic_conv.py.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../checks.h"
#include "../dropconnect.h"
#include "../dynamic_conv_step.h"
#include "softmax_rows_cpu.h"
#include "vector_clones.h"

namespace talk_hf {
namespace {

struct Dims {
  int64_t B, T, C, H, R, K, P;
  int64_t ws;  // weight position stride: H*K, or 0 for a LightConv kernel read by every position
};

// Positions are processed in chunks of (b, t) pairs: enough work per task, no false sharing on outputs.
constexpr int64_t kGrain = 16;

// acc[h*R .. (h+1)*R) += w * src[0 .. R)
template <typename scalar_t, typename acc_t>
inline void axpy(acc_t w, const scalar_t* __restrict__ src, acc_t* __restrict__ acc, int64_t R) {
#pragma omp simd
  for (int64_t c = 0; c < R; ++c) acc[c] += w * static_cast<acc_t>(src[c]);
}

// out[b, t, :] = sum_k w[h, k] * x[b, t + k - P, :], w: this position's (H, K) weights (storage or accumulation
// type); acc: C scratch.
template <typename scalar_t, typename acc_t, typename w_t>
TALK_HF_VECTOR_CLONES void forward_position(const scalar_t* x, const w_t* w, scalar_t* out, const Dims& d,
                                            int64_t bt, acc_t* acc) {
  const int64_t b = bt / d.T, t = bt % d.T;
  std::fill(acc, acc + d.C, acc_t(0));
  for (int64_t h = 0; h < d.H; ++h) {
    for (int64_t k = 0; k < d.K; ++k) {
      const int64_t s = t + k - d.P;
      if (s < 0 || s >= d.T) continue;
      axpy(static_cast<acc_t>(w[h * d.K + k]), x + (b * d.T + s) * d.C + h * d.R, acc + h * d.R, d.R);
    }
  }
  scalar_t* o = out + bt * d.C;
  for (int64_t c = 0; c < d.C; ++c) o[c] = static_cast<scalar_t>(acc[c]);
}

// grad_x[b, s, :] = sum_k w[b, t, h, k] * g[b, t, :] with t = s - k + P; w: all weights (storage type, or the
// probabilities in the accumulation type); acc: C scratch.
template <typename scalar_t, typename acc_t, typename w_t>
TALK_HF_VECTOR_CLONES void grad_x_position(const scalar_t* g, const w_t* w, scalar_t* gx, const Dims& d,
                                           int64_t bs, acc_t* acc) {
  const int64_t b = bs / d.T, s = bs % d.T;
  std::fill(acc, acc + d.C, acc_t(0));
  for (int64_t h = 0; h < d.H; ++h) {
    for (int64_t k = 0; k < d.K; ++k) {
      const int64_t t = s - k + d.P;
      if (t < 0 || t >= d.T) continue;
      axpy(static_cast<acc_t>(w[(b * d.T + t) * d.ws + h * d.K + k]), g + (b * d.T + t) * d.C + h * d.R,
           acc + h * d.R, d.R);
    }
  }
  scalar_t* o = gx + bs * d.C;
  for (int64_t c = 0; c < d.C; ++c) o[c] = static_cast<scalar_t>(acc[c]);
}

// The normalised taps of `rows` consecutive rows of K weights w (storage type) into taps (accumulation type): the
// weights, or their softmax over each row.
template <typename scalar_t, typename acc_t>
void normalised_taps(const scalar_t* w, bool softmax, int64_t rows, int64_t K, acc_t* taps) {
  if (softmax) {
    softmax_rows(w, rows, K, taps);
    return;
  }
  for (int64_t i = 0; i < rows * K; ++i) taps[i] = static_cast<acc_t>(w[i]);
}

// factors[i] = DropConnect's factor of tap first + i, i < n (dc on).
template <typename acc_t>
TALK_HF_VECTOR_CLONES void dropconnect_factors(const DropConnect<acc_t>& dc, int64_t first, int64_t n,
                                               acc_t* __restrict__ factors) {
  const acc_t scale = dc.scale;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) factors[i] = dc.kept(first + i) ? scale : acc_t(0);
}

// The taps of positions [bt, bt + n) (laid out as the weights from position bt's, accumulation type): probs = the
// normalised taps, factors = DropConnect's (only when dc is on), taps = probs * factors (taps may be probs: in place).
// Without DropConnect the taps are probs.
template <typename scalar_t, typename acc_t>
void tap_tables(const scalar_t* w, bool softmax, const DropConnect<acc_t>& dc, const Dims& d, int64_t bt, int64_t n,
                acc_t* probs, acc_t* factors, acc_t* taps) {
  const int64_t first = bt * d.ws, count = n * d.H * d.K;
  normalised_taps(w + first, softmax, n * d.H, d.K, probs);
  if (!dc.on) return;
  dropconnect_factors(dc, first, count, factors);
  for (int64_t i = 0; i < count; ++i) taps[i] = probs[i] * factors[i];
}

// gp[h*K + k] = sum over the head's channels of g[b, t, c] * x[b, t + k - P, c]: the gradient of position bt's taps.
template <typename scalar_t, typename acc_t>
TALK_HF_VECTOR_CLONES void tap_grads_position(const scalar_t* g, const scalar_t* x, const Dims& d, int64_t bt,
                                              acc_t* gp) {
  const int64_t b = bt / d.T, t = bt % d.T;
  for (int64_t h = 0; h < d.H; ++h) {
    const scalar_t* __restrict__ gt = g + bt * d.C + h * d.R;
    for (int64_t k = 0; k < d.K; ++k) {
      const int64_t s = t + k - d.P;
      acc_t sum = 0;
      if (s >= 0 && s < d.T) {
        const scalar_t* __restrict__ xs = x + (b * d.T + s) * d.C + h * d.R;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < d.R; ++c) sum += static_cast<acc_t>(gt[c]) * static_cast<acc_t>(xs[c]);
      }
      gp[h * d.K + k] = sum;
    }
  }
}

// gp (the taps' gradient, H*K) -> the gradient of position bt's weights: times DropConnect's factors (this
// position's, H*K, or nullptr), then through the softmax with probs (this position's probabilities, H*K, or
// nullptr): p_k * (gp_k - sum_j p_j gp_j).
template <typename acc_t>
void weight_grads_from_tap_grads(const acc_t* probs, const acc_t* factors, const Dims& d, acc_t* gp) {
  if (factors != nullptr)
    for (int64_t i = 0; i < d.H * d.K; ++i) gp[i] *= factors[i];
  if (probs == nullptr) return;
  for (int64_t h = 0; h < d.H; ++h) {
    const acc_t* p = probs + h * d.K;
    acc_t* gh = gp + h * d.K;
    acc_t dot = 0;
    for (int64_t k = 0; k < d.K; ++k) dot += p[k] * gh[k];
    for (int64_t k = 0; k < d.K; ++k) gh[k] = p[k] * (gh[k] - dot);
  }
}

template <typename scalar_t, typename acc_t>
void forward_kernel(const scalar_t* x, const scalar_t* w, bool softmax, const DropConnect<acc_t>& dc,
                    scalar_t* out, const Dims& d) {
  const bool own_taps = softmax || dc.on;  // else the weights are the taps
  at::parallel_for(0, d.B * d.T, kGrain, [&](int64_t begin, int64_t end) {
    const int64_t n = own_taps ? d.H * d.K : 0;
    std::vector<acc_t> acc(d.C), taps(n), factors(dc.on ? n : 0);
    for (int64_t bt = begin; bt < end; ++bt) {
      const scalar_t* wpos = w + bt * d.ws;
      if (!own_taps) {
        forward_position(x, wpos, out, d, bt, acc.data());
        continue;
      }
      if (d.ws != 0 || bt == begin)  // a LightConv kernel: once
        tap_tables(w, softmax, dc, d, bt, 1, taps.data(), factors.data(), taps.data());
      forward_position(x, static_cast<const acc_t*>(taps.data()), out, d, bt, acc.data());
    }
  });
}

template <typename scalar_t, typename acc_t, typename w_t>
void grad_x_kernel(const scalar_t* g, const w_t* w, scalar_t* gx, const Dims& d) {
  at::parallel_for(0, d.B * d.T, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> acc(d.C);
    for (int64_t bs = begin; bs < end; ++bs) grad_x_position(g, w, gx, d, bs, acc.data());
  });
}

// gw (B, T, H, K) = the weights' gradient, from the backward's tables (probs when softmax, factors with
// DropConnect; nullptr otherwise; laid out as the weights).
template <typename scalar_t, typename acc_t>
void grad_weight_kernel(const scalar_t* g, const scalar_t* x, const acc_t* probs, const acc_t* factors,
                        scalar_t* gw, const Dims& d) {
  at::parallel_for(0, d.B * d.T, kGrain, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> gp(d.H * d.K);
    for (int64_t bt = begin; bt < end; ++bt) {
      tap_grads_position(g, x, d, bt, gp.data());
      weight_grads_from_tap_grads(probs ? probs + bt * d.ws : nullptr, factors ? factors + bt * d.ws : nullptr, d,
                                  gp.data());
      for (int64_t i = 0; i < d.H * d.K; ++i) gw[bt * d.H * d.K + i] = static_cast<scalar_t>(gp[i]);
    }
  });
}

// x (B, T, C), w (B, T, H, K) as given (sizes), cw: how the kernels read w.
Dims make_dims(const at::Tensor& x, const at::Tensor& w, const ConvWeight& cw, int64_t padding_left) {
  return {x.size(0), x.size(1), x.size(2), w.size(2), x.size(2) / w.size(2), w.size(3), padding_left,
          cw.broadcast ? 0 : w.size(2) * w.size(3)};
}

at::Tensor dynamic_conv_fwd_cpu(const at::Tensor& x_, const at::Tensor& w_, int64_t padding_left, bool softmax,
                                const c10::optional<at::Tensor>& seed, double weight_dropout) {
  check_dynamic_conv_inputs(x_, w_);
  check_dropconnect_args(x_, seed, weight_dropout);
  const at::Tensor x = x_.contiguous();
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0) return out;
  const ConvWeight cw = conv_weight(w_);
  const at::Tensor& w = cw.data;
  const Dims d = make_dims(x, w_, cw, padding_left);
  const int64_t seed_value = weight_dropout > 0.0 ? seed->item<int64_t>() : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dynamic_conv_fwd_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    forward_kernel<scalar_t, acc_t>(x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), softmax,
                                    make_dropconnect<acc_t>(weight_dropout, seed_value), out.data_ptr<scalar_t>(), d);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> dynamic_conv_bwd_cpu(const at::Tensor& g_, const at::Tensor& x_,
                                                        const at::Tensor& w_, int64_t padding_left, bool softmax,
                                                        const c10::optional<at::Tensor>& seed,
                                                        double weight_dropout) {
  check_dynamic_conv_inputs(x_, w_);
  check_dropconnect_args(x_, seed, weight_dropout);
  TORCH_CHECK(g_.sizes() == x_.sizes() && g_.scalar_type() == x_.scalar_type(),
              "dynamic_conv backward: grad_out must match x");
  const at::Tensor g = g_.contiguous(), x = x_.contiguous();
  at::Tensor gx = at::empty_like(x), gw = at::empty(w_.sizes(), w_.options());  // per position, also for LightConv
  if (x.numel() == 0) return {gx, gw.zero_()};
  const ConvWeight cw = conv_weight(w_);
  const at::Tensor& w = cw.data;
  const Dims d = make_dims(x, w_, cw, padding_left);
  const int64_t seed_value = weight_dropout > 0.0 ? seed->item<int64_t>() : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dynamic_conv_bwd_cpu", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t *gp = g.data_ptr<scalar_t>(), *xp = x.data_ptr<scalar_t>(), *wp = w.data_ptr<scalar_t>();
    const DropConnect<acc_t> dc = make_dropconnect<acc_t>(weight_dropout, seed_value);
    if (!softmax && !dc.on) {
      grad_x_kernel<scalar_t, acc_t>(gp, wp, gx.data_ptr<scalar_t>(), d);
      grad_weight_kernel<scalar_t, acc_t>(gp, xp, nullptr, nullptr, gw.data_ptr<scalar_t>(), d);
      return;
    }
    const int64_t n = w.numel();
    std::vector<acc_t> probs(n), factors(dc.on ? n : 0), dropped(dc.on ? n : 0);
    const acc_t* taps = dc.on ? dropped.data() : probs.data();
    at::parallel_for(0, d.ws != 0 ? d.B * d.T : 1, kGrain, [&](int64_t begin, int64_t end) {
      const auto from = [&](std::vector<acc_t>& t) { return t.empty() ? nullptr : t.data() + begin * d.ws; };
      tap_tables(wp, softmax, dc, d, begin, end - begin, from(probs), from(factors), from(dropped));
    });
    grad_x_kernel<scalar_t, acc_t>(gp, taps, gx.data_ptr<scalar_t>(), d);
    grad_weight_kernel<scalar_t, acc_t>(gp, xp, softmax ? probs.data() : nullptr, dc.on ? factors.data() : nullptr,
                                        gw.data_ptr<scalar_t>(), d);
  });
  return {gx, gw};
}

// Decoding step(s) of one batch row, row by row (same arithmetic as conv_step_column); acc: C scratch, probs: H*K
// scratch (used with softmax).
template <typename scalar_t>
TALK_HF_VECTOR_CLONES void conv_step_batch_row(const ConvStepArgs<scalar_t>& a, int64_t b, acc_type<scalar_t>* acc,
                                               acc_type<scalar_t>* probs) {
  using acc_t = acc_type<scalar_t>;
  const int64_t R = a.C / a.H;
  for (int64_t t = 0; t < a.T; ++t) {
    const scalar_t* wpos = a.weight + (b * a.T + t) * a.ws;
    if (a.softmax) softmax_rows(wpos, a.H, a.K, probs);
    std::fill(acc, acc + a.C, acc_t(0));
    for (int64_t k = 0; k < a.K; ++k) {
      const scalar_t* __restrict__ row = conv_step_row(a, b, t + k);
      for (int64_t h = 0; h < a.H; ++h) {
        const acc_t w = a.softmax ? probs[h * a.K + k] : static_cast<acc_t>(wpos[h * a.K + k]);
        const scalar_t* __restrict__ xs = row + h * R;
        acc_t* __restrict__ dst = acc + h * R;
#pragma omp simd
        for (int64_t c = 0; c < R; ++c) dst[c] += w * static_cast<acc_t>(xs[c]);
      }
    }
    scalar_t* __restrict__ out = a.out + (b * a.T + t) * a.C;
    for (int64_t c = 0; c < a.C; ++c) out[c] = static_cast<scalar_t>(acc[c]);
  }
  for (int64_t i = 0; i < a.K - 1; ++i) {
    const scalar_t* row = conv_step_row(a, b, a.T + i);
    std::copy(row, row + a.C, a.new_state + (b * (a.K - 1) + i) * a.C);
  }
}

std::tuple<at::Tensor, at::Tensor> dynamic_conv_step_cpu(const at::Tensor& x_, const at::Tensor& w_,
                                                         const at::Tensor& state_, bool softmax) {
  check_dynamic_conv_step_inputs(x_, w_, state_);
  const at::Tensor x = x_.contiguous(), state = state_.contiguous();
  const ConvWeight cw = conv_weight(w_);
  const at::Tensor& w = cw.data;
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), H = w_.size(2), K = w_.size(3);
  at::Tensor out = at::empty_like(x), new_state = at::empty_like(state);
  if (T == 0 || B == 0 || C == 0) return {out, new_state.copy_(state)};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "dynamic_conv_step_cpu", [&] {
    const ConvStepArgs<scalar_t> a{x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(), state.data_ptr<scalar_t>(),
                                   out.data_ptr<scalar_t>(), new_state.data_ptr<scalar_t>(), B, T, C, H, K,
                                   softmax, cw.broadcast ? 0 : H * K};
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 18) / ((K + T) * C));  // >= 256K elements per task
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      std::vector<acc_type<scalar_t>> acc(C), probs(softmax ? H * K : 0);
      for (int64_t b = begin; b < end; ++b) conv_step_batch_row(a, b, acc.data(), probs.data());
    });
  });
  return {out, new_state};
}

}  // namespace

TORCH_LIBRARY_IMPL(talk_hf, CPU, m) {
  m.impl("dynamic_conv_fwd", &dynamic_conv_fwd_cpu);
  m.impl("dynamic_conv_bwd", &dynamic_conv_bwd_cpu);
  m.impl("dynamic_conv_step", &dynamic_conv_step_cpu);
}

}  // namespace talk_hf
