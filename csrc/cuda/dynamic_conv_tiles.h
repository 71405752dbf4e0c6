// Block program of the CUDA DynamicConv / LightConv weight gradient (dynamic_conv.cu); tests/ops/cuda_tile_emulator.cpp
// runs the same function on the CPU, one fiber per thread (barriers checked, shared memory poisoned with NaN).
// Layouts as in csrc/dynamic_conv_math.h.
//
//   grad_w[b, t, h, k] = sum_{r < R} grad_out[b, t, h*R + r] * x[b, t + k - P, h*R + r]   (x = 0 outside [0, T))
//
// Block = (b, tile of kWgSteps steps from t0, head h, chunk of up to kWgTaps taps from k0), kWgSteps x (taps / 8)
// threads: thread (i = tid % kWgSteps, j = tid / kWgSteps) owns step t0 + i and the taps k0 + 8j .. k0 + 8j + 7. For
// each chunk of kWgChannels of the head's channels the block stages the grad_out rows [t0, t0 + kWgSteps) and the x
// rows [t0 + k0 - P, t0 + k0 - P + kWgSteps + taps - 1) of those channels in shared memory (as accumulators, rows
// padded to kWgStride words so that the 32 steps of a warp read 32 rows of one column without bank conflicts),
// then every thread adds 8 products per channel from 9 shared loads. The x row of (step t0 + i, tap k0 + 8j + q)
// is staged row i + 8j + q. Each grad_out element is read once per tap chunk, each x element about
// (kWgSteps + taps) / kWgSteps times; no atomics, a fixed summation order.
#pragma once
#include <stdint.h>

#include "../dynamic_conv_math.h"

namespace talk_hf {
namespace conv_tiles {

constexpr int64_t kWgSteps = 64;      // steps per block
constexpr int64_t kWgTaps = 32;       // taps per block at most
constexpr int64_t kWgTapsPerThread = 8;
constexpr int64_t kWgChannels = 32;   // channels staged per round
constexpr int64_t kWgStride = kWgChannels + 1;

// Taps a block covers: min(K, kWgTaps) rounded up to a multiple of 8 (the taps past K are computed, not stored).
TALK_HD int64_t wg_taps(const ConvDims& d) {
  return cdiv(min64(d.K, kWgTaps), kWgTapsPerThread) * kWgTapsPerThread;
}

TALK_HD int64_t wg_threads(const ConvDims& d) { return kWgSteps * wg_taps(d) / kWgTapsPerThread; }

TALK_HD int64_t wg_num_blocks(const ConvDims& d) {
  return d.B * cdiv(d.T, kWgSteps) * d.H * cdiv(d.K, kWgTaps);
}

// Accumulators of shared memory: the grad_out rows, then the x rows.
TALK_HD int64_t wg_shared_elems(const ConvDims& d) { return (2 * kWgSteps + wg_taps(d) - 1) * kWgStride; }

struct WgBlock {
  int64_t b, t0, h, k0;
};

// Block `index`, tap chunks fastest, then heads: the blocks of one (b, step tile) run together and share x in L2.
TALK_HD WgBlock wg_block(const ConvDims& d, int64_t index) {
  const int64_t chunks = cdiv(d.K, kWgTaps), tiles = cdiv(d.T, kWgSteps);
  WgBlock k;
  k.k0 = index % chunks * kWgTaps;
  k.h = index / chunks % d.H;
  k.t0 = index / (chunks * d.H) % tiles * kWgSteps;
  k.b = index / (chunks * d.H * tiles);
  return k;
}

// Stage the channels [r0, r0 + kWgChannels) of the grad_out rows and the x rows (zeros outside the sequence and
// past the head's channels). Consecutive threads read consecutive channels of a row.
template <typename Block, typename scalar_t>
TALK_BLOCK void wg_stage(const Block& blk, const scalar_t* x, const scalar_t* grad_out, const ConvDims& d,
                         const WgBlock& k, int64_t r0, acc_type<scalar_t>* gs, acc_type<scalar_t>* xs) {
  using acc_t = acc_type<scalar_t>;
  const int64_t x_first = k.t0 + k.k0 - d.P, x_rows = kWgSteps + wg_taps(d) - 1;
  const int64_t channel0 = k.h * d.R + r0;
  for (int64_t n = blk.tid(); n < (kWgSteps + x_rows) * kWgChannels; n += blk.size()) {
    const int64_t row = n / kWgChannels, col = n % kWgChannels;
    const bool channel = r0 + col < d.R;
    if (row < kWgSteps) {
      const int64_t t = k.t0 + row;
      gs[row * kWgStride + col] =
          channel && t < d.T ? to_acc(grad_out[(k.b * d.T + t) * d.C + channel0 + col]) : acc_t(0);
    } else {
      const int64_t s = x_first + row - kWgSteps;
      xs[(row - kWgSteps) * kWgStride + col] =
          channel && s >= 0 && s < d.T ? to_acc(x[(k.b * d.T + s) * d.C + channel0 + col]) : acc_t(0);
    }
  }
}

// The whole program of one block. grad_weight: the storage type, or the accumulation type (the raw tap gradients
// gp that the softmax gradient turns into the logits' gradient).
template <typename Block, typename scalar_t, typename gw_t>
TALK_BLOCK void wg_block_program(const Block& blk, const scalar_t* x, const scalar_t* grad_out, gw_t* grad_weight,
                                 const ConvDims& d, int64_t index, acc_type<scalar_t>* smem) {
  using acc_t = acc_type<scalar_t>;
  const WgBlock k = wg_block(d, index);
  acc_t* gs = smem;
  acc_t* xs = smem + kWgSteps * kWgStride;
  const int64_t i = blk.tid() % kWgSteps, j = blk.tid() / kWgSteps;
  const acc_t* g_row = gs + i * kWgStride;
  const acc_t* x_rows = xs + (i + j * kWgTapsPerThread) * kWgStride;
  acc_t partial[kWgTapsPerThread] = {};
  for (int64_t r0 = 0; r0 < d.R; r0 += kWgChannels) {
    wg_stage(blk, x, grad_out, d, k, r0, gs, xs);
    blk.sync();
    const int64_t channels = min64(kWgChannels, d.R - r0);
    for (int64_t c = 0; c < channels; ++c) {
      const acc_t g = g_row[c];
      TALK_UNROLL
      for (int q = 0; q < kWgTapsPerThread; ++q) partial[q] += g * x_rows[q * kWgStride + c];
    }
    blk.sync();  // the next round (or the next block) restages
  }
  const int64_t t = k.t0 + i;
  if (t >= d.T) return;
  gw_t* out = grad_weight + ((k.b * d.T + t) * d.H + k.h) * d.K;
  TALK_UNROLL
  for (int q = 0; q < kWgTapsPerThread; ++q) {
    const int64_t tap = k.k0 + j * kWgTapsPerThread + q;
    if (tap < d.K) out[tap] = from_acc<gw_t>(partial[q]);
  }
}

}  // namespace conv_tiles
}  // namespace talk_hf
