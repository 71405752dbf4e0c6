// Window-end arithmetic of the TaLK convolution, shared by the CPU and CUDA kernels (no torch headers).
// Specification: talk_hf/talk_conv.py (`_window_end`, `talk_conv_ref`).
#pragma once
#include <stdint.h>

#include "acc_cast.h"

namespace talk_hf {

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

// The two ends of the window of step t as rows of a summed-area table whose row i holds S_{i-1} (row 0 is 0):
// S~(l - 1) interpolates rows left.lo, left.hi and S~(r) rows right.lo, right.hi. `offset_left` / `offset_right`
// are the relative offsets (in units of max_left / max_right); the causal form (no right offsets) ends at row t + 1.
template <typename acc_t>
TALK_HD WindowEnd<acc_t> left_window_end(acc_t offset_left, int64_t max_left, int64_t t, int64_t seqlen) {
  return window_end<acc_t>(t, -offset_left * static_cast<acc_t>(max_left), seqlen);
}

template <typename acc_t>
TALK_HD WindowEnd<acc_t> right_window_end(bool has_right, acc_t offset_right, int64_t max_right, int64_t t,
                                          int64_t seqlen) {
  if (!has_right) return {t + 1, t + 1, acc_t(0)};
  const WindowEnd<acc_t> w = window_end<acc_t>(t, offset_right * static_cast<acc_t>(max_right), seqlen);
  return {w.lo + 1, w.hi + 1, w.frac};
}

// How many table rows before / after t the window of step t reads (0 when none): the backward of a tile of steps
// only needs the outputs whose rows can reach it.
template <typename acc_t>
TALK_HD int64_t rows_before(int64_t t, const WindowEnd<acc_t>& left, const WindowEnd<acc_t>& right) {
  const int64_t n = t - left.lo > t - right.lo ? t - left.lo : t - right.lo;
  return n > 0 ? n : 0;
}

template <typename acc_t>
TALK_HD int64_t rows_after(int64_t t, const WindowEnd<acc_t>& left, const WindowEnd<acc_t>& right) {
  const int64_t n = left.hi - t > right.hi - t ? left.hi - t : right.hi - t;
  return n > 0 ? n : 0;
}

}  // namespace talk_hf
