// Element programs of the CUDA dynamic-convolution kernels (csrc/cuda/dynamic_conv.cu): one output element per
// call (the softmax of `softmax=True` and DropConnect are separate passes over the rows, softmax_row.h and the lane
// programs at the end; the weight gradient is a block program, csrc/cuda/dynamic_conv_tiles.h). The kernels are grid-stride loops around them;
// tests/ops/cuda_tile_emulator.cpp runs the same functions on the CPU over every element, against the reference.
// Specification: talk_hf/dynamic_conv.py.
//
// Layouts (all contiguous, batch-first, channels-last):
//   x, out, grad_out, grad_x   (B, T, C)     at [(b*T + t)*C + c]
//   weight                     (B, T, H, K)  at [(b*T + t)*ws + h*K + k]; ws = H*K, or 0 for a LightConv kernel
//                                            (H, K) that every position reads; head of channel c: h = c / R, R = C / H
//   grad_weight                (B, T, H, K)  at [((b*T + t)*H + h)*K + k] (per position, also for LightConv)
//   out[b, t, c] = sum_k w[b, t, h, k] * x[b, t + k - P, c]   (x = 0 outside [0, T); w normalised: the weights,
//   or the softmax probabilities of the logits)
#pragma once
#include <stdint.h>

#include "acc_cast.h"
#include "dropconnect.h"
#include "softmax_row.h"

namespace talk_hf {

struct ConvDims {
  int64_t B, T, C, H, R, K;
  int64_t P;  // padding_left, clamped to [-(T + K), T + K] (same result: beyond that every tap is out of range)
  int64_t ws;  // weight position stride (H*K or 0)
};

// Rows of weights (and of softmax logits): one per (b, t, h), or the H rows of a LightConv kernel.
TALK_HD int64_t weight_rows(const ConvDims& d) { return (d.ws != 0 ? d.B * d.T : 1) * d.H; }

// Element n = (b*T + t)*C + c of a (B, T, C) tensor.
struct ConvElement {
  int64_t b, t, c, bt;
};

TALK_HD ConvElement conv_element(const ConvDims& d, int64_t n) {
  const int64_t bt = n / d.C;
  const int64_t b = bt / d.T;
  return {b, bt - b * d.T, n - bt * d.C, bt};
}

// out[n], n = (b*T + t)*C + c: the in-range taps k in [max(0, P - t), min(K, T + P - t)). weight: in the storage
// type, or the softmax probabilities in the accumulation type (laid out as the weights).
template <typename scalar_t, typename w_t>
TALK_HD void conv_fwd_element(const scalar_t* x, const w_t* weight, scalar_t* out, const ConvDims& d, int64_t n) {
  using acc_t = acc_type<scalar_t>;
  const auto [b, t, c, bt] = conv_element(d, n);
  const w_t* wrow = weight + bt * d.ws + c / d.R * d.K;
  const scalar_t* xcol = x + b * d.T * d.C + c;
  acc_t acc = acc_t(0);
  for (int64_t k = max64(0, d.P - t); k < min64(d.K, d.T + d.P - t); ++k)
    acc += to_acc(wrow[k]) * to_acc(xcol[(t + k - d.P) * d.C]);
  out[n] = from_acc<scalar_t>(acc);
}

// grad_x[n], n = (b*T + s)*C + c: sum_k w[b, t, h, k] * grad_out[b, t, c] with t = s - k + P, over
// k in [max(0, s + P - T + 1), min(K, s + P + 1)) (exactly the taps with 0 <= t < T). w: the weights in the storage
// type, or the softmax probabilities in the accumulation type (laid out as the weights).
template <typename scalar_t, typename w_t>
TALK_HD void conv_grad_x_element(const w_t* w, const scalar_t* grad_out, scalar_t* grad_x, const ConvDims& d,
                                 int64_t n) {
  using acc_t = acc_type<scalar_t>;
  const auto [b, s, c, bs] = conv_element(d, n);
  const int64_t h = c / d.R;
  acc_t acc = acc_t(0);
  for (int64_t k = max64(0, s + d.P - d.T + 1); k < min64(d.K, s + d.P + 1); ++k) {
    const int64_t bt = b * d.T + (s - k + d.P);
    acc += to_acc(w[bt * d.ws + h * d.K + k]) * to_acc(grad_out[bt * d.C + c]);
  }
  grad_x[n] = from_acc<scalar_t>(acc);
}

// Lane programs of the rows passes around the convolution when the kernels form the taps themselves (softmax or
// DropConnect): a group of `group` lanes per row of K weights (row = (b*T + t)*H + h, or h for a LightConv kernel),
// lane `lane` taking the taps k = lane, lane + group, ...; `first` = row * K, the flat index of the row's tap 0
// (DropConnect's draw of tap k is dc.factor(first + k)).
//
// taps[k] = (the weight, or its softmax probability with the row's stats s) * DropConnect's factor.
template <typename T>
TALK_HD void taps_lane_write(const T* w_row, int64_t K, bool softmax, const SoftmaxStats<acc_type<T>>& s,
                             const DropConnect<acc_type<T>>& dc, int64_t first, acc_type<T>* taps, int lane,
                             int group) {
  for (int64_t k = lane; k < K; k += group) {
    const acc_type<T> v = to_acc(w_row[k]);
    taps[k] = (softmax ? softmax_prob(s, v) : v) * dc.factor(first + k);
  }
}

// The weights' gradient of a row from its taps' gradient gp with DropConnect on: dropped taps get the factor 0.
// Without a softmax, grad[k] = gp_k f_k (no reduction); with one, whose probabilities p_k come from the logits and
// the row's stats s: grad[k] = p_k (gp_k f_k - sum_j p_j gp_j f_j), the lane's share of the sum first. Both take
// gp_k f_k rounded on its own (mul_rn), so a one-tap row (p = 1) gets exactly 0, as the reference does.
template <typename T>
TALK_HD acc_type<T> dropconnect_grad_lane_dot(const T* logits, const SoftmaxStats<acc_type<T>>& s,
                                              const acc_type<T>* gp, const DropConnect<acc_type<T>>& dc,
                                              int64_t first, int64_t K, int lane, int group) {
  acc_type<T> dot = 0;
  for (int64_t k = lane; k < K; k += group)
    dot += softmax_prob(s, to_acc(logits[k])) * mul_rn(gp[k], dc.factor(first + k));
  return dot;
}

template <typename T>
TALK_HD void dropconnect_grad_lane_write(const T* w_row, bool softmax, const SoftmaxStats<acc_type<T>>& s,
                                         const acc_type<T>* gp, const DropConnect<acc_type<T>>& dc, int64_t first,
                                         int64_t K, acc_type<T> dot, T* grad, int lane, int group) {
  for (int64_t k = lane; k < K; k += group) {
    const acc_type<T> g = mul_rn(gp[k], dc.factor(first + k));
    grad[k] = from_acc<T>(softmax ? softmax_prob(s, to_acc(w_row[k])) * (g - dot) : g);
  }
}

}  // namespace talk_hf
