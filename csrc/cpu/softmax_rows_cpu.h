// Row softmax for the CPU dynamic-convolution kernels (softmax=True): exp runs as a vectorisable polynomial (the
// C library's expf is a scalar call, which made a fused softmax slower than torch.softmax's vectorised exp).
// fp32: Cephes' expf reduction and polynomial (relative error ~1e-7, arguments clamped to [-87, 88], so an
// exponent that underflows gives ~1e-38 instead of 0); fp64: std::exp. Same definition as softmax_row.h.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "vector_clones.h"

namespace talk_hf {

// v[i] = exp(v[i]) for i < n. no-trapping-math lets GCC turn the clamps into vector min/max (nothing here reads
// floating-point exception flags).
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-trapping-math")))
#endif
TALK_HF_VECTOR_CLONES inline void exp_inplace(float* __restrict__ v, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float lo = v[i] > -87.0f ? v[i] : -87.0f;
    const float x = lo < 88.0f ? lo : 88.0f;
    const int32_t ki = static_cast<int32_t>(__builtin_rintf(x * 1.44269504088896341f));  // x = k ln2 + r, |r| <= ln2/2
    const float k = static_cast<float>(ki);
    const float r = x - k * 0.693359375f - k * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    v[i] = p * __builtin_bit_cast(float, (ki + 127) << 23);  // * 2^k
  }
}

inline void exp_inplace(double* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = std::exp(v[i]);
}

// Whether torch.softmax gives a row of K logits NaN throughout: it holds a NaN, or its maximum is infinite (+inf
// minus itself, or every logit -inf). exp_inplace's clamps would make such a row finite.
template <typename acc_t, typename scalar_t>
bool nan_softmax_row(const scalar_t* logits, int64_t K) {
  acc_t m = -std::numeric_limits<acc_t>::infinity();
  for (int64_t k = 0; k < K; ++k) {
    const acc_t v = static_cast<acc_t>(logits[k]);
    if (std::isnan(v)) return true;
    m = v > m ? v : m;
  }
  return K > 0 && std::isinf(m);
}

// probs[0 .. rows*K) = softmax over each row of K logits, in the accumulation type acc_t; a row that torch.softmax
// makes NaN (nan_softmax_row) is NaN here too.
template <typename scalar_t, typename acc_t>
void softmax_rows(const scalar_t* logits, int64_t rows, int64_t K, acc_t* probs) {
  if (K == 0) return;
  for (int64_t i = 0; i < rows * K; ++i) probs[i] = static_cast<acc_t>(logits[i]);
  bool any_nan_row = false;  // only then are the rows checked one by one after exp
  for (int64_t r = 0; r < rows; ++r) {
    acc_t* row = probs + r * K;
    acc_t m = row[0];
    for (int64_t k = 1; k < K; ++k) m = (row[k] > m || row[k] != row[k]) ? row[k] : m;  // a NaN stays the max
    any_nan_row |= !std::isfinite(m);
    for (int64_t k = 0; k < K; ++k) row[k] -= m;
  }
  exp_inplace(probs, rows * K);
  for (int64_t r = 0; r < rows; ++r) {
    acc_t* row = probs + r * K;
    if (any_nan_row && nan_softmax_row<acc_t>(logits + r * K, K)) {
      std::fill(row, row + K, std::numeric_limits<acc_t>::quiet_NaN());
      continue;
    }
    acc_t sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += row[k];
    const acc_t inv = acc_t(1) / sum;
    for (int64_t k = 0; k < K; ++k) row[k] *= inv;
  }
}

}  // namespace talk_hf
