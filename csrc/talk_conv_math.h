// Window-end arithmetic of the TaLK convolution, shared by the CPU and CUDA kernels (no torch headers).
// Specification: talk_hf/talk_conv.py (`_window_end`, `talk_conv_ref`).
#pragma once
#include <math.h>
#include <stdint.h>

#include "host_device.h"

namespace talk_hf {

TALK_HD float floor_acc(float v) { return floorf(v); }
TALK_HD double floor_acc(double v) { return floor(v); }

// The window end t + rel, clamped to [0, T-1], as two integer positions and a fraction:
// S~(t + rel) = S[lo] + frac * (S[hi] - S[lo]), hi = lo + (frac > 0). The fraction comes from `rel` alone, so it
// keeps full precision for any t. The slope S[hi] - S[lo] is the derivative w.r.t. rel (zero when clamped or on
// an integer position, as in the reference implementation).
template <typename acc_t>
struct WindowEnd {
  int64_t lo, hi;
  acc_t frac;
};

template <typename acc_t>
TALK_HD WindowEnd<acc_t> window_end(int64_t t, acc_t rel, int64_t seqlen) {
  const acc_t bound = static_cast<acc_t>(seqlen);
  rel = rel < -bound ? -bound : (rel > bound ? bound : rel);  // keeps the integer cast defined
  const acc_t whole = floor_acc(rel);
  const acc_t frac = rel - whole;
  const int64_t lo = t + static_cast<int64_t>(whole);
  if (lo < 0) return {0, 0, acc_t(0)};
  if (lo >= seqlen - 1) return {seqlen - 1, seqlen - 1, acc_t(0)};
  return {lo, lo + (frac > acc_t(0) ? 1 : 0), frac};
}

// S_j of the summed-area table with S_{-1} = 0, given a table `sat` whose row i holds S_{i-1}.
// Callers index sat[lo] for S~(l - 1) (left end) and sat[lo + 1] for S~(r) (right end).

}  // namespace talk_hf
