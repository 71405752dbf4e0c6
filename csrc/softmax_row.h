// Softmax of one row of K kernel logits, for the dynamic convolution kernels that normalise their own weights
// (`softmax=True`): p_k = exp(l_k - max) / sum_j exp(l_j - max), in the accumulation type, without a buffer of K
// probabilities (a CUDA thread cannot hold one for any K): `softmax_stats` reads the row twice (max, then the sum),
// `softmax_prob` gives one p_k from its logit. Shared by the CPU kernels, the CUDA kernels and the emulator tests.
// Specification: `dynamic_conv_ref(..., softmax=True)` in talk_hf/dynamic_conv.py (torch.softmax in fp32/fp64).
#pragma once
#include <math.h>
#include <stdint.h>

#include "acc_cast.h"

namespace talk_hf {

TALK_HD float acc_exp(float v) { return expf(v); }
TALK_HD double acc_exp(double v) { return exp(v); }

template <typename acc_t>
struct SoftmaxStats {
  acc_t max;      // largest logit of the row
  acc_t inv_sum;  // 1 / sum_j exp(l_j - max)
};

// row: K >= 1 logits in a storage type that `to_acc` converts (the CPU kernels pass rows already in acc_t).
template <typename T>
TALK_HD SoftmaxStats<acc_type<T>> softmax_stats(const T* row, int64_t K) {
  using acc_t = acc_type<T>;
  acc_t m = to_acc(row[0]);
  for (int64_t k = 1; k < K; ++k) {
    const acc_t v = to_acc(row[k]);
    m = v > m ? v : m;
  }
  acc_t sum = acc_t(0);
  for (int64_t k = 0; k < K; ++k) sum += acc_exp(to_acc(row[k]) - m);
  return {m, acc_t(1) / sum};
}

template <typename acc_t>
TALK_HD acc_t softmax_prob(const SoftmaxStats<acc_t>& s, acc_t logit) {
  return acc_exp(logit - s.max) * s.inv_sum;
}

}  // namespace talk_hf
