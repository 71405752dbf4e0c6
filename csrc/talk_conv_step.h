// One decoding step (or a few) of the causal TaLK convolution from its fixed-size state, shared by the CPU kernel
// (csrc/cpu/talk_conv_cpu.cpp, a parallel loop over columns) and the CUDA kernel (csrc/cuda/talk_conv.cu, one thread
// per column). Specification: `talk_conv_step` in talk_hf/talk_conv.py (the reference path, used under autograd).
//
// A column is one (batch row b, channel c). State (B, r, C), r = max_left + 2, in the accumulation type: the last r
// prefix sums S minus the one before them. ext (B, r + T, C) is scratch: the state rows, then S after each new
// token. out_t = (S_t - S~(l_t - 1)) / (max_left + 1) with l_t - 1 = t - offset * max_left - 1, offsets clipped to
// [0, 1] (decoding uses no offset dropout); the new state is the last r rows of ext minus the row before them.
#pragma once
#include <stdint.h>

#include "acc_cast.h"
#include "talk_conv_math.h"

namespace talk_hf {

template <typename scalar_t>
struct TalkStepArgs {
  using acc_t = acc_type<scalar_t>;
  const scalar_t* x;            // (B, T, C) new tokens
  const scalar_t* offset_left;  // (B, T, H)
  const acc_t* state;           // (B, r, C)
  scalar_t* out;                // (B, T, C)
  acc_t* new_state;             // (B, r, C)
  acc_t* ext;                   // (B, r + T, C) scratch
  int64_t B, T, C, H, max_left;
};

// The left end of new token t: S~(l - 1) = ext[lo] + frac * (ext[lo + 1] - ext[lo]) with the offset clipped to
// [0, 1], so lo is in [t + 1, t + r - 1] (no clamping needed).
template <typename acc_t>
struct StepEnd {
  int64_t lo;
  acc_t frac;
};

template <typename acc_t>
TALK_HD StepEnd<acc_t> step_left_end(acc_t offset, int64_t max_left, int64_t t) {
  const acc_t o = offset < acc_t(0) ? acc_t(0) : (offset > acc_t(1) ? acc_t(1) : offset);
  const acc_t rel = -o * static_cast<acc_t>(max_left);
  const acc_t whole = floor_acc(rel);
  return {t + max_left + 1 + static_cast<int64_t>(whole), rel - whole};  // t + r - 1 + whole, r = max_left + 2
}

template <typename scalar_t>
TALK_HD void talk_step_column(const TalkStepArgs<scalar_t>& a, int64_t b, int64_t c) {
  using acc_t = acc_type<scalar_t>;
  const int64_t r = a.max_left + 2, C = a.C, h = c / (a.C / a.H);
  acc_t* e = a.ext + b * (r + a.T) * C + c;  // e[i * C]: ext row i of this column
  const acc_t* s = a.state + b * r * C + c;
  for (int64_t i = 0; i < r; ++i) e[i * C] = s[i * C];
  acc_t run = s[(r - 1) * C];
  for (int64_t t = 0; t < a.T; ++t) {
    run += to_acc(a.x[(b * a.T + t) * C + c]);
    e[(r + t) * C] = run;
  }
  const acc_t norm = static_cast<acc_t>(a.max_left + 1);
  for (int64_t t = 0; t < a.T; ++t) {
    const StepEnd<acc_t> l = step_left_end(to_acc(a.offset_left[(b * a.T + t) * a.H + h]), a.max_left, t);
    const acc_t at_lo = e[l.lo * C];
    const acc_t left = l.frac > acc_t(0) ? at_lo + l.frac * (e[(l.lo + 1) * C] - at_lo) : at_lo;
    a.out[(b * a.T + t) * C + c] = from_acc<scalar_t>((e[(r + t) * C] - left) / norm);
  }
  const acc_t base = e[(a.T - 1) * C];  // the row before the new state's first row (r + T - r - 1)
  for (int64_t i = 0; i < r; ++i) a.new_state[(b * r + i) * C + c] = e[(a.T + i) * C] - base;
}

}  // namespace talk_hf
