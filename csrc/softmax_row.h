// Softmax of one row of K kernel logits, for the dynamic convolution kernels that normalise their own weights
// (`softmax=True`): p_k = exp(l_k - max) / sum_j exp(l_j - max), in the accumulation type, without a buffer of K
// probabilities (a CUDA thread cannot hold one for any K): `softmax_stats` reads the row twice (max, then the sum),
// `softmax_prob` gives one p_k from its logit. Used by the CUDA kernels (and their programs in the emulator tests);
// the CPU kernels normalise whole positions at once with a vectorised exp (csrc/cpu/softmax_rows_cpu.h).
// Specification: `dynamic_conv_ref(..., softmax=True)` in talk_hf/dynamic_conv.py (torch.softmax in fp32/fp64).
#pragma once
#include <stdint.h>

#include "acc_cast.h"

namespace talk_hf {

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

// probs[0 .. K) = softmax(logits[0 .. K)) in the accumulation type.
template <typename T>
TALK_HD void softmax_probs_row(const T* logits, int64_t K, acc_type<T>* probs) {
  const SoftmaxStats<acc_type<T>> s = softmax_stats(logits, K);
  for (int64_t k = 0; k < K; ++k) probs[k] = softmax_prob(s, to_acc(logits[k]));
}

// The gradient of a row's logits from its probabilities p and the gradient gp of the probabilities:
// grad[k] = p_k * (gp_k - sum_j p_j gp_j), stored as scalar_t.
template <typename scalar_t>
TALK_HD void softmax_grad_row(const acc_type<scalar_t>* p, const acc_type<scalar_t>* gp, int64_t K, scalar_t* grad) {
  acc_type<scalar_t> dot = 0;
  for (int64_t k = 0; k < K; ++k) dot += p[k] * gp[k];
  for (int64_t k = 0; k < K; ++k) grad[k] = from_acc<scalar_t>(p[k] * (gp[k] - dot));
}

}  // namespace talk_hf
