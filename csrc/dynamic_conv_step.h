// One decoding step (or a few) of the causal dynamic / lightweight convolution (padding K - 1) from its state, the
// last K - 1 inputs. The column program below (one (batch row b, channel c) per call) is the CUDA kernel's
// (csrc/cuda/dynamic_conv.cu, one thread per column); the CPU kernel (csrc/cpu/dynamic_conv_cpu.cpp) walks rows with
// the same arithmetic. Specification: `dynamic_conv_step` in talk_hf/dynamic_conv.py (its PyTorch form is the
// autograd path).
//
// With the extended input e = [state; x] ((K - 1 + T) rows): out_t = sum_k weight[t, h, k] * e[t + k] (sums in the
// accumulation type; with softmax, weight holds logits and softmax(weight[t, h, :]) is used), and the new state is
// e's last K - 1 rows.
#pragma once
#include <stdint.h>

#include "acc_cast.h"
#include "softmax_row.h"

namespace talk_hf {

template <typename scalar_t>
struct ConvStepArgs {
  const scalar_t* x;       // (B, T, C) new tokens
  const scalar_t* weight;  // (B, T, H, K) (or (H, K), ws = 0): normalised, or logits with softmax
  const scalar_t* state;   // (B, K - 1, C)
  scalar_t* out;           // (B, T, C)
  scalar_t* new_state;     // (B, K - 1, C)
  int64_t B, T, C, H, K;
  bool softmax;
  int64_t ws;  // weight position stride: H*K, or 0 for a LightConv kernel read by every position
};

// Row i of the extended input of batch row b, as a pointer to its C channels.
template <typename scalar_t>
TALK_HD const scalar_t* conv_step_row(const ConvStepArgs<scalar_t>& a, int64_t b, int64_t i) {
  return i < a.K - 1 ? a.state + (b * (a.K - 1) + i) * a.C : a.x + (b * a.T + i - (a.K - 1)) * a.C;
}

template <typename scalar_t>
TALK_HD void conv_step_column(const ConvStepArgs<scalar_t>& a, int64_t b, int64_t c) {
  using acc_t = acc_type<scalar_t>;
  const int64_t h = c / (a.C / a.H);
  for (int64_t t = 0; t < a.T; ++t) {
    const scalar_t* w = a.weight + (b * a.T + t) * a.ws + h * a.K;
    const SoftmaxStats<acc_t> s = a.softmax ? softmax_stats(w, a.K) : SoftmaxStats<acc_t>{acc_t(0), acc_t(1)};
    acc_t sum = acc_t(0);
    for (int64_t k = 0; k < a.K; ++k) {
      const acc_t wk = a.softmax ? softmax_prob(s, to_acc(w[k])) : to_acc(w[k]);
      sum += wk * to_acc(conv_step_row(a, b, t + k)[c]);
    }
    a.out[(b * a.T + t) * a.C + c] = from_acc<scalar_t>(sum);
  }
  for (int64_t i = 0; i < a.K - 1; ++i) a.new_state[(b * (a.K - 1) + i) * a.C + c] = conv_step_row(a, b, a.T + i)[c];
}

}  // namespace talk_hf
