// Softmax of one row of K kernel logits, for the dynamic convolution kernels that normalise their own weights
// (`softmax=True`): p_k = exp(l_k - max) / sum_j exp(l_j - max), in the accumulation type, without a buffer of K
// probabilities (a CUDA thread cannot hold one for any K): `softmax_stats` reads the row twice (max, then the sum),
// `softmax_prob` gives one p_k from its logit (the CUDA decoding step); the lane programs below split a row over
// a group of lanes (the CUDA forward and backward). Used by the CUDA kernels (and their programs in the emulator
// tests); the CPU kernels normalise whole positions at once with a vectorised exp (csrc/cpu/softmax_rows_cpu.h).
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

constexpr int64_t kSoftmaxTapsPerLane = 4;  // a group of lanes per row: about this many taps per lane

// Lanes per row group (K = 31: 8 lanes, four rows per warp, so that a warp has four rows' loads and reductions in
// flight instead of one).
TALK_HD int softmax_group_lanes(int64_t K) { return lane_group(K, kSoftmaxTapsPerLane); }

// Lane programs of a group of G lanes sharing one row (the CUDA softmax kernels: a group per row, lane j takes the
// taps j, j + G, ...; the group's reductions combine the lanes' partials, so every tap is read by one lane only):
//   m = max over lanes of softmax_lane_max, s = sum over lanes of softmax_lane_sum(m), then each lane writes its
//   probabilities with softmax_lane_probs({m, 1 / s}); for the gradient, dot = sum over lanes of
//   softmax_grad_lane_dot, then each lane writes its taps with softmax_grad_lane_write(dot).
template <typename T>
TALK_HD acc_type<T> softmax_lane_max(const T* row, int64_t K, int lane, int group) {
  acc_type<T> m = to_acc(row[0]);  // a lower bound of the row's max for every lane, even one with no tap
  for (int64_t k = lane; k < K; k += group) {
    const acc_type<T> v = to_acc(row[k]);
    m = v > m ? v : m;
  }
  return m;
}

template <typename T>
TALK_HD acc_type<T> softmax_lane_sum(const T* row, int64_t K, acc_type<T> max, int lane, int group) {
  acc_type<T> sum = 0;
  for (int64_t k = lane; k < K; k += group) sum += acc_exp(to_acc(row[k]) - max);
  return sum;
}

template <typename T>
TALK_HD void softmax_lane_probs(const T* row, int64_t K, const SoftmaxStats<acc_type<T>>& s, acc_type<T>* probs,
                                int lane, int group) {
  for (int64_t k = lane; k < K; k += group) probs[k] = softmax_prob(s, to_acc(row[k]));
}

// grad[k] = p_k * (gp_k - sum_j p_j gp_j), stored as scalar_t: the lane's share of the dot product, then its taps.
template <typename acc_t>
TALK_HD acc_t softmax_grad_lane_dot(const acc_t* p, const acc_t* gp, int64_t K, int lane, int group) {
  acc_t dot = 0;
  for (int64_t k = lane; k < K; k += group) dot += p[k] * gp[k];
  return dot;
}

template <typename scalar_t>
TALK_HD void softmax_grad_lane_write(const acc_type<scalar_t>* p, const acc_type<scalar_t>* gp, int64_t K,
                                     acc_type<scalar_t> dot, scalar_t* grad, int lane, int group) {
  for (int64_t k = lane; k < K; k += group) grad[k] = from_acc<scalar_t>(p[k] * (gp[k] - dot));
}

}  // namespace talk_hf
