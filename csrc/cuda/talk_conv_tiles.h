// Block programs of the fused CUDA TaLK kernels (talk_conv.cu). Specification: talk_hf/talk_conv.py.
//
// Every kernel is a sequence of phases separated by block barriers, and every phase is a function of
// (block, warp, lane) over plain pointers. talk_conv.cu runs them on the GPU (one CUDA thread per (warp, lane),
// __syncthreads() between phases); tests/ops/cuda_tile_emulator.cpp runs the same functions on the CPU, phase by
// phase, every thread of a block in turn, and tests/ops/test_cuda_tile_programs.py compares the result with
// talk_conv_ref. That checks the indexing, halos and barrier placement without a GPU; compute-sanitizer's racecheck
// on a GPU (scripts/gpu_check.sh) checks what a sequential run cannot (two threads writing one word in one phase).
//
// Layouts as in talk_hf_kernels.h: x, out, grad (B, T, C); offsets (B, T, H); head of channel c is c / R, R = C / H.
// Table rows: row i of the summed-area table holds S_{i-1} = x_0 + ... + x_{i-1} (row 0 is 0); the window of step
// t reads rows l.lo, l.hi (left end) and r.lo, r.hi (right end, shifted by one), see talk_conv_math.h.
//
// Forward, block = (b, tile of `tile` steps, 32 consecutive channels; lane = channel), `warps` warps:
//   1. fwd_scan:      each warp sums its segment of the rows [base, top] the tile's windows read (for offsets in
//                     [0, 1]: t0 - max_left .. t1 + max_right) into shared memory, relative to row `base`;
//      fwd_windows:   meanwhile the block's threads work out the window ends of every (step, head) of the tile
//                     once, as rows relative to `base` (the lanes of a head share them instead of each redoing
//                     the offset load and the window arithmetic for every step)
//   2. fwd_carry:     each thread adds up the totals of the segments before its own
//   3. fwd_add_carry: ... and adds that to its segment: table[i] = S_{base+i-1} - S_{base-1}
//   4. fwd_gather:    out = (S~(r) - S~(l - 1)) / norm from the table at the rows of fwd_windows; a window with
//                     an end outside [base, top] (offsets outside [0, 1], or a window too wide for shared memory)
//                     is worked out again and summed from x in global memory.
//   x is read once plus the halo (from L2), the output written once; no atomics.
// Backward, three kernels:
//   - reach: per (b, h), how far before / after t any window end row lies (a thread's maximum over kReachSteps
//     steps, then atomicMax of non-negative integers: deterministic) - bounds which outputs a tile of grad x must
//     look at, for any offsets;
//   - offset gradients: per (b, t, h), d out / d offset = max_left (max_right) * sum_c g_c / norm * slope_c, where
//     the slope S[hi] - S[lo] of an interpolated end is the one element x[lo] between its two rows (0 when clamped
//     or integral): no prefix sums needed;
//   - grad x, unit = (b, tile, 32 channels), one warp, lane = channel, each lane owning its column of a shared
//     tile buffer q: scatter +-w * g / norm of every window end of the outputs that can reach the tile into q
//     (rows (t0, t1]) or into a running `carry` (rows > t1), then grad x_j = carry + sum_{i = j+1..t1} q[i], from
//     the top down. An output whose rows all lie above t1 adds +w and -w (cancels) and one whose rows all lie at or
//     below t0 adds nothing, so the outputs [t0 + 1 - after, t1 - 1 + before] are enough. The window ends of each
//     (step, head) are worked out once per warp, 32 pairs per round, into shared memory (a warp barrier on either
//     side); the lanes share no other word: no atomics, a fixed summation order.
#pragma once
#include <stdint.h>

#include "../acc_cast.h"
#include "../talk_conv_math.h"

namespace talk_hf {
namespace tiles {

constexpr int kLanes = 32;                     // channels per forward block / grad-x unit (one warp)
constexpr int64_t kSharedBudget = 48 * 1024;   // bytes of shared memory per block without an opt-in
constexpr int kFwdWarps = 8;                   // warps per forward block
constexpr int kGradXWarps = 4;                 // grad-x units (one warp each) per block
constexpr int kGradXBatch = 4;                 // grad x: steps whose inputs a thread loads before it uses the first

template <typename scalar_t>
struct TalkArgs {
  const scalar_t* x;                 // (B, T, C)
  const scalar_t* offset_left;       // (B, T, H)
  const scalar_t* offset_right;      // (B, T, H), nullptr when !has_right
  scalar_t* out;                     // (B, T, C)       forward
  const scalar_t* grad_out;          // (B, T, C)       backward
  scalar_t* grad_x;                  // (B, T, C)       backward
  scalar_t* grad_offset_left;        // (B, T, H)       backward
  scalar_t* grad_offset_right;       // (B, T, H) or nullptr
  unsigned long long* reach;         // (B, H, 2)       backward: rows before / after t read by (b, h)'s windows
  int64_t B, T, C, H, R, max_left, max_right;
  bool has_right;
  int64_t tile;                      // time steps per forward block / grad-x unit
  int64_t rows;                      // forward: table rows kept in shared memory (>= 1)
  int64_t heads_max;                 // forward: most heads 32 consecutive channels can span
  int warps;                         // forward: warps per block
};

// ------------------------------------------------------------------------------------------------ window ends

// The window ends of step t (row b*T + t = bt) of head h, as table rows (talk_conv_math.h).
template <typename acc_t, typename scalar_t>
TALK_HD WindowEnd<acc_t> left_end(const TalkArgs<scalar_t>& a, int64_t bt, int64_t t, int64_t h) {
  return left_window_end(to_acc(a.offset_left[bt * a.H + h]), a.max_left, t, a.T);
}

template <typename acc_t, typename scalar_t>
TALK_HD WindowEnd<acc_t> right_end(const TalkArgs<scalar_t>& a, int64_t bt, int64_t t, int64_t h) {
  const acc_t offset = a.has_right ? to_acc(a.offset_right[bt * a.H + h]) : acc_t(0);
  return right_window_end(a.has_right, offset, a.max_right, t, a.T);
}

template <typename scalar_t>
TALK_HD int64_t norm_of(const TalkArgs<scalar_t>& a) { return a.max_left + a.max_right + 1; }

// ------------------------------------------------------------------------------------------------ forward

// A tile of the work: batch row b, steps [t0, t1), channels [c0, c0 + 32) (those < C), which belong to the heads
// h_first .. h_first + heads - 1.
struct Tile {
  int64_t b, t0, t1, c0;
  int64_t h_first, heads;
};

// Tile `index` of `a.tile` steps and 32 channels; tiles run tile-fastest, so neighbouring tiles (which read each
// other's halo) run together and share L2.
template <typename scalar_t>
TALK_HD Tile tile_at(const TalkArgs<scalar_t>& a, int64_t index) {
  const int64_t tiles = cdiv(a.T, a.tile), chunks = cdiv(a.C, kLanes);
  Tile k;
  k.c0 = (index / tiles % chunks) * kLanes;
  k.b = index / (tiles * chunks);
  k.t0 = index % tiles * a.tile;
  k.t1 = min64(a.T, k.t0 + a.tile);
  k.h_first = k.c0 / a.R;
  k.heads = (min64(a.C, k.c0 + kLanes) - 1) / a.R - k.h_first + 1;
  return k;
}

template <typename scalar_t>
TALK_HD int64_t num_tiles(const TalkArgs<scalar_t>& a) {
  return a.B * cdiv(a.T, a.tile) * cdiv(a.C, kLanes);
}

struct FwdBlock : Tile {
  int64_t base, top;  // table rows [base, top] kept in shared memory
};

// The window of one (step, head) as table rows relative to the block's `base`, when all four rows lie in
// [base, top] (`inside`); otherwise the gather works the window out again from the offsets.
template <typename acc_t>
struct alignas(16) WindowRows {  // 32 bytes for fp32 accumulators: two 16-byte shared loads
  int32_t l_lo, l_hi, r_lo, r_hi;  // S~(l - 1) interpolates rows l_lo, l_hi; S~(r) rows r_lo, r_hi
  acc_t l_frac, r_frac;
  int32_t inside;
};

// Shared memory of a forward block: the table (rows x 32 accumulators), the segment carries (warps x 32), then
// the windows (tile x heads_max). `acc_bytes` picks the accumulator type (4: fp32, 8: fp64).
TALK_HD int64_t fwd_accumulators_bytes(int64_t rows, int64_t warps, int64_t acc_bytes) {
  return (rows + warps) * kLanes * acc_bytes;
}

// sizeof(S<acc_t>) for accumulators of acc_bytes bytes (4: float, 8: double).
template <template <typename> class S>
TALK_HD int64_t bytes_with_acc(int64_t acc_bytes) {
  return acc_bytes == 8 ? static_cast<int64_t>(sizeof(S<double>)) : static_cast<int64_t>(sizeof(S<float>));
}

template <typename scalar_t>
TALK_HD int64_t fwd_shared_bytes(const TalkArgs<scalar_t>& a, int64_t acc_bytes) {
  return fwd_accumulators_bytes(a.rows, a.warps, acc_bytes) + a.tile * a.heads_max * bytes_with_acc<WindowRows>(acc_bytes);
}

template <typename scalar_t>
TALK_HD FwdBlock fwd_block(const TalkArgs<scalar_t>& a, int64_t block) {
  FwdBlock k;
  static_cast<Tile&>(k) = tile_at(a, block);
  k.base = max64(0, k.t0 - a.max_left);
  const int64_t top = min64(a.T, k.t1 + (a.has_right ? a.max_right : 0));
  k.top = min64(top, k.base + a.rows - 1);
  return k;
}

// Rows [first, last) of the segment of warp w among the rows 1..top-base that get a sum (row 0 is the base).
struct Segment {
  int64_t first, last;
};

template <typename scalar_t>
TALK_HD Segment fwd_segment(const TalkArgs<scalar_t>& a, const FwdBlock& k, int w) {
  const int64_t n = k.top - k.base, len = cdiv(n, a.warps);
  const int64_t first = min64(n + 1, 1 + w * len);
  return {first, min64(n + 1, first + len)};
}

// Phase 1: table[i] = x[base] + ... + x[base + i - 1] within the segment (relative to the segment's start).
template <typename scalar_t>
TALK_HD void fwd_scan(const TalkArgs<scalar_t>& a, const FwdBlock& k, acc_type<scalar_t>* table, int w, int lane) {
  using acc_t = acc_type<scalar_t>;
  const int64_t c = k.c0 + lane;
  const bool active = c < a.C;
  if (w == 0) table[lane] = acc_t(0);
  const Segment s = fwd_segment(a, k, w);
  const scalar_t* xc = a.x + (k.b * a.T + k.base - 1) * a.C + c;  // row i reads x[base + i - 1]
  acc_t sum = acc_t(0);
  for (int64_t i = s.first; i < s.last; ++i) {
    if (active) sum += to_acc(xc[i * a.C]);
    table[i * kLanes + lane] = sum;
  }
}

// Phase 2: carry[w] = total of the segments before w.
template <typename scalar_t>
TALK_HD void fwd_carry(const TalkArgs<scalar_t>& a, const FwdBlock& k, const acc_type<scalar_t>* table,
                       acc_type<scalar_t>* carry, int w, int lane) {
  acc_type<scalar_t> sum = 0;
  for (int v = 0; v < w; ++v) {
    const Segment s = fwd_segment(a, k, v);
    if (s.last > s.first) sum += table[(s.last - 1) * kLanes + lane];
  }
  carry[w * kLanes + lane] = sum;
}

// Phase 3: table[i] += carry[w] over the segment: table[i] = S_{base+i-1} - S_{base-1}.
template <typename scalar_t>
TALK_HD void fwd_add_carry(const TalkArgs<scalar_t>& a, const FwdBlock& k, acc_type<scalar_t>* table,
                           const acc_type<scalar_t>* carry, int w, int lane) {
  const Segment s = fwd_segment(a, k, w);
  const acc_type<scalar_t> add = carry[w * kLanes + lane];
  for (int64_t i = s.first; i < s.last; ++i) table[i * kLanes + lane] += add;
}

// Phase 1 too (no thread reads what another writes here before the gather): the windows of the steps [t0, t1)
// and the block's heads, entry (t - t0) * heads + (h - h_first), spread over the block's threads.
template <typename scalar_t>
TALK_HD void fwd_windows(const TalkArgs<scalar_t>& a, const FwdBlock& k, WindowRows<acc_type<scalar_t>>* windows,
                         int w, int lane) {
  using acc_t = acc_type<scalar_t>;
  const int64_t n = (k.t1 - k.t0) * k.heads;
  for (int64_t i = static_cast<int64_t>(w) * kLanes + lane; i < n; i += static_cast<int64_t>(a.warps) * kLanes) {
    const int64_t t = k.t0 + i / k.heads, h = k.h_first + i % k.heads, bt = k.b * a.T + t;
    const WindowEnd<acc_t> l = left_end<acc_t>(a, bt, t, h), r = right_end<acc_t>(a, bt, t, h);
    WindowRows<acc_t> e{0, 0, 0, 0, acc_t(0), acc_t(0), 0};
    if (min64(l.lo, r.lo) >= k.base && max64(l.hi, r.hi) <= k.top) {
      e = {static_cast<int32_t>(l.lo - k.base), static_cast<int32_t>(l.hi - k.base),
           static_cast<int32_t>(r.lo - k.base), static_cast<int32_t>(r.hi - k.base), l.frac, r.frac, 1};
    }
    windows[i] = e;
  }
}

// Table row `row` of channel c relative to row `base`, from shared memory, or summed from x outside [base, top].
template <typename scalar_t>
TALK_HD acc_type<scalar_t> table_at(const TalkArgs<scalar_t>& a, const FwdBlock& k, const acc_type<scalar_t>* table,
                                    int lane, int64_t row) {
  using acc_t = acc_type<scalar_t>;
  const scalar_t* xc = a.x + k.b * a.T * a.C + k.c0 + lane;
  if (row < k.base) {
    acc_t sum = acc_t(0);
    for (int64_t i = row; i < k.base; ++i) sum += to_acc(xc[i * a.C]);
    return -sum;
  }
  if (row > k.top) {
    acc_t sum = table[(k.top - k.base) * kLanes + lane];
    for (int64_t i = k.top; i < row; ++i) sum += to_acc(xc[i * a.C]);
    return sum;
  }
  return table[(row - k.base) * kLanes + lane];
}

// S~ at a window end interpolated between table rows lo and hi: at(lo) + frac (at(hi) - at(lo)), at(lo) alone when
// hi == lo (a clamped or integral end).
template <typename acc_t, typename index_t, typename RowAt>
TALK_HD acc_t interpolate(RowAt at, index_t lo, index_t hi, acc_t frac) {
  const acc_t at_lo = at(lo);
  if (hi == lo) return at_lo;
  return at_lo + frac * (at(hi) - at_lo);
}

// Phase 4: warp w writes the steps t0 + w, t0 + w + warps, ... of its lane's channel.
template <typename scalar_t>
TALK_HD void fwd_gather(const TalkArgs<scalar_t>& a, const FwdBlock& k, const acc_type<scalar_t>* table,
                        const WindowRows<acc_type<scalar_t>>* windows, int w, int lane) {
  using acc_t = acc_type<scalar_t>;
  const int64_t c = k.c0 + lane;
  if (c >= a.C) return;
  const int64_t h = c / a.R;
  const acc_t inv_norm = acc_t(1) / static_cast<acc_t>(norm_of(a));
  for (int64_t t = k.t0 + w; t < k.t1; t += a.warps) {
    const int64_t bt = k.b * a.T + t;
    const WindowRows<acc_t>& e = windows[(t - k.t0) * k.heads + (h - k.h_first)];
    acc_t sum;
    if (e.inside) {  // rows relative to base
      const auto at = [&](int32_t row) { return table[row * kLanes + lane]; };
      sum = interpolate(at, e.r_lo, e.r_hi, e.r_frac) - interpolate(at, e.l_lo, e.l_hi, e.l_frac);
    } else {
      const auto at = [&](int64_t row) { return table_at(a, k, table, lane, row); };
      const WindowEnd<acc_t> l = left_end<acc_t>(a, bt, t, h), r = right_end<acc_t>(a, bt, t, h);
      sum = interpolate(at, r.lo, r.hi, r.frac) - interpolate(at, l.lo, l.hi, l.frac);
    }
    a.out[bt * a.C + c] = from_acc<scalar_t>(sum * inv_norm);
  }
}

// ------------------------------------------------------------------------------------------------ backward

// Rows before / after t that the window of (b, t, h) reads, clamped at 0 (the reach arrays start at 0).
template <typename scalar_t>
TALK_HD void reach_of(const TalkArgs<scalar_t>& a, int64_t b, int64_t t, int64_t h, int64_t* before,
                      int64_t* after) {
  using acc_t = acc_type<scalar_t>;
  const int64_t bt = b * a.T + t;
  const WindowEnd<acc_t> l = left_end<acc_t>(a, bt, t, h), r = right_end<acc_t>(a, bt, t, h);
  *before = rows_before(t, l, r);
  *after = rows_after(t, l, r);
}

constexpr int64_t kReachSteps = 64;  // steps per thread of the reach kernel (one atomicMax pair per thread)

// The largest rows_before / rows_after over the steps [t_begin, t_end) of (b, h).
template <typename scalar_t>
TALK_HD void reach_of_steps(const TalkArgs<scalar_t>& a, int64_t b, int64_t h, int64_t t_begin, int64_t t_end,
                            int64_t* before, int64_t* after) {
  *before = 0;
  *after = 0;
  for (int64_t t = t_begin; t < t_end; ++t) {
    int64_t bf, af;
    reach_of(a, b, t, h, &bf, &af);
    *before = max64(*before, bf);
    *after = max64(*after, af);
  }
}

// d interpolate / d frac of a window end, times g / norm: x[lo] (the element between rows lo and lo + 1), or 0.
template <typename acc_t, typename scalar_t>
TALK_HD acc_t slope_term(const scalar_t* xb, int64_t C, int64_t c, const WindowEnd<acc_t>& e, acc_t gn) {
  return e.hi == e.lo ? acc_t(0) : gn * to_acc(xb[e.lo * C + c]);
}

// Partial sums over the channels r_begin, r_begin + r_step, ... of head h of step t:
// sum_c g_c / norm * slope_c at the left and at the right end.
template <typename scalar_t>
TALK_HD void offset_grad_partial(const TalkArgs<scalar_t>& a, int64_t b, int64_t t, int64_t h, int64_t r_begin,
                                 int64_t r_step, acc_type<scalar_t>* sum_left, acc_type<scalar_t>* sum_right) {
  using acc_t = acc_type<scalar_t>;
  const int64_t bt = b * a.T + t;
  const WindowEnd<acc_t> l = left_end<acc_t>(a, bt, t, h), r = right_end<acc_t>(a, bt, t, h);
  const scalar_t* xb = a.x + b * a.T * a.C;
  const acc_t inv_norm = acc_t(1) / static_cast<acc_t>(norm_of(a));
  acc_t sl = acc_t(0), sr = acc_t(0);
  for (int64_t rr = r_begin; rr < a.R; rr += r_step) {
    const int64_t c = h * a.R + rr;
    const acc_t gn = to_acc(a.grad_out[bt * a.C + c]) * inv_norm;
    sl += slope_term(xb, a.C, c, l, gn);
    sr += slope_term(xb, a.C, c, r, gn);
  }
  *sum_left = sl;
  *sum_right = sr;
}

constexpr int64_t kOffsetGradChannelsPerLane = 4;

// Lanes per (b, t, h) group of the offset-gradient kernel (R = 64: 16 lanes, two (b, t, h) per warp in flight; 32
// lanes of 2 channels each waited on one at a time).
TALK_HD int offset_grad_group(int64_t R) { return lane_group(R, kOffsetGradChannelsPerLane); }

// d out / d offset_left = +max_left * slope / norm (rel = -offset * max_left enters with a minus, left with another).
template <typename scalar_t>
TALK_HD void write_offset_grads(const TalkArgs<scalar_t>& a, int64_t bth, acc_type<scalar_t> sum_left,
                                acc_type<scalar_t> sum_right) {
  using acc_t = acc_type<scalar_t>;
  a.grad_offset_left[bth] = from_acc<scalar_t>(static_cast<acc_t>(a.max_left) * sum_left);
  if (a.has_right) a.grad_offset_right[bth] = from_acc<scalar_t>(static_cast<acc_t>(a.max_right) * sum_right);
}

// Where a window end of an output sends weight * g in grad-x unit u (weight includes the 1 / norm): a row of q (table
// rows (t0, t1], q row row - t0 - 1), the carry (rows above t1), or nowhere (rows at or below t0, or weight 0).
constexpr int32_t kToCarry = -1;
constexpr int32_t kNowhere = -2;

template <typename acc_t>
struct alignas(16) EndTargets {  // the four window ends of one (step, head): 32 bytes for fp32 accumulators
  int32_t at[4];
  acc_t weight[4];
};

template <typename acc_t>
TALK_HD int32_t target_of(const Tile& u, int64_t row, acc_t weight) {
  if (weight == acc_t(0) || row <= u.t0) return kNowhere;
  if (row > u.t1) return kToCarry;
  return static_cast<int32_t>(row - u.t0 - 1);
}

// Left end: -(1 - frac) at lo, -frac at hi (it enters with a minus); right end: 1 - frac at lo, frac at hi; each
// times 1 / norm.
template <typename acc_t>
TALK_HD EndTargets<acc_t> end_targets(const Tile& u, const WindowEnd<acc_t>& l, const WindowEnd<acc_t>& r,
                                      acc_t inv_norm) {
  const int64_t rows[4] = {l.lo, l.hi, r.lo, r.hi};
  EndTargets<acc_t> e{{0, 0, 0, 0},
                      {-(acc_t(1) - l.frac) * inv_norm, -l.frac * inv_norm, (acc_t(1) - r.frac) * inv_norm,
                       r.frac * inv_norm}};
  for (int j = 0; j < 4; ++j) e.at[j] = target_of(u, rows[j], e.weight[j]);
  return e;
}

// One lane of a grad-x warp: its channel c (head h) and the outputs [first, last] of that head that reach the tile.
struct GxLane {
  int64_t c, h, first, last;
};

// A grad-x unit: its tile and the outputs [first, last] whose windows can reach the tile for any of its heads.
struct GxUnit : Tile {
  int64_t first, last;
};

// The outputs of head h whose windows can reach the tile: [t0 + 1 - after, t1 - 1 + before] within [0, T - 1].
template <typename scalar_t>
TALK_HD void gx_outputs(const TalkArgs<scalar_t>& a, const Tile& u, int64_t h, int64_t* first, int64_t* last) {
  const unsigned long long* reach = a.reach + (u.b * a.H + h) * 2;
  *first = max64(0, u.t0 + 1 - static_cast<int64_t>(reach[1]));
  *last = min64(a.T - 1, u.t1 - 1 + static_cast<int64_t>(reach[0]));
}

template <typename scalar_t>
TALK_HD GxUnit gx_unit(const TalkArgs<scalar_t>& a, const Tile& tile) {
  GxUnit u;
  static_cast<Tile&>(u) = tile;
  u.first = a.T;
  u.last = -1;
  for (int64_t h = u.h_first; h < u.h_first + u.heads; ++h) {
    int64_t first, last;
    gx_outputs(a, u, h, &first, &last);
    u.first = min64(u.first, first);
    u.last = max64(u.last, last);
  }
  return u;
}

// Steps per round of a grad-x warp: the window ends of (steps x heads) <= 32 (step, head) pairs, one per lane.
TALK_HD int64_t gx_round_steps(int64_t heads) { return heads >= kLanes ? 1 : kLanes / heads; }

// Round phase 1: lane i works out the targets of pair i = (s + i / heads, h_first + i % heads) into ends[i].
template <typename scalar_t>
TALK_HD void gx_targets(const TalkArgs<scalar_t>& a, const GxUnit& u, int64_t s, acc_type<scalar_t> inv_norm,
                        EndTargets<acc_type<scalar_t>>* ends, int lane) {
  using acc_t = acc_type<scalar_t>;
  const int64_t t = s + lane / u.heads, h = u.h_first + lane % u.heads;
  if (lane >= gx_round_steps(u.heads) * u.heads || t > u.last) return;
  const int64_t bt = u.b * a.T + t;
  ends[lane] = end_targets(u, left_end<acc_t>(a, bt, t, h), right_end<acc_t>(a, bt, t, h), inv_norm);
}

// Round phase 2: the lane adds weight * g of the round's steps of its head to its column of q or to its carry (steps
// in order, ends in the order left lo, left hi, right lo, right hi).
template <typename scalar_t>
TALK_HD void gx_scatter(const TalkArgs<scalar_t>& a, const GxUnit& u, int64_t s,
                        const EndTargets<acc_type<scalar_t>>* ends, const GxLane& l, acc_type<scalar_t>* q, int lane,
                        acc_type<scalar_t>* carry) {
  using acc_t = acc_type<scalar_t>;
  const int64_t begin = max64(s, l.first), end = min64(s + gx_round_steps(u.heads) - 1, l.last);
  for (int64_t t0 = begin; t0 <= end; t0 += kGradXBatch) {  // the loads of kGradXBatch steps, then their use
    acc_t g[kGradXBatch];
    TALK_UNROLL
    for (int v = 0; v < kGradXBatch; ++v) g[v] = to_acc(a.grad_out[(u.b * a.T + min64(t0 + v, end)) * a.C + l.c]);
    TALK_UNROLL
    for (int v = 0; v < kGradXBatch; ++v) {
      const int64_t t = t0 + v;
      if (t > end) break;
      const EndTargets<acc_t>& e = ends[(t - s) * u.heads + (l.h - u.h_first)];
      TALK_UNROLL
      for (int j = 0; j < 4; ++j) {
        if (e.at[j] >= 0) {
          q[e.at[j] * kLanes + lane] += e.weight[j] * g[v];
        } else if (e.at[j] == kToCarry) {
          *carry += e.weight[j] * g[v];
        }
      }
    }
  }
}

// The grad-x program of one warp for one unit. Rounds of up to 32 (step, head) pairs: the lanes work out the pairs'
// window ends once into `ends` (32 entries of shared memory), then each lane scatters its channel's share. Apart
// from `ends`, a lane reads and writes only its own column of q (a.tile x 32 accumulators): grad x_j = carry +
// sum_{i = j+1..t1} q[i], from the top down; a fixed summation order, no atomics.
template <typename Warp, typename scalar_t>
TALK_BLOCK void gx_warp(const Warp& warp, const TalkArgs<scalar_t>& a, const Tile& tile, acc_type<scalar_t>* q,
                        EndTargets<acc_type<scalar_t>>* ends) {
  using acc_t = acc_type<scalar_t>;
  const int lane = static_cast<int>(warp.tid());
  const GxUnit u = gx_unit(a, tile);
  GxLane l{u.c0 + lane, (u.c0 + lane) / a.R, 0, -1};
  const bool active = l.c < a.C;  // lanes past C still work out window ends and reach every barrier
  if (active) {
    gx_outputs(a, u, l.h, &l.first, &l.last);
    for (int64_t i = 0; i < u.t1 - u.t0; ++i) q[i * kLanes + lane] = acc_t(0);
  }
  const acc_t inv_norm = acc_t(1) / static_cast<acc_t>(norm_of(a));
  acc_t carry = acc_t(0);
  for (int64_t s = u.first; s <= u.last; s += gx_round_steps(u.heads)) {
    gx_targets(a, u, s, inv_norm, ends, lane);
    warp.sync();
    if (active) gx_scatter(a, u, s, ends, l, q, lane, &carry);
    warp.sync();  // the next round overwrites ends
  }
  if (!active) return;
  acc_t sum = carry;
  for (int64_t j = u.t1 - 1; j >= u.t0; --j) {
    sum += q[(j - u.t0) * kLanes + lane];
    a.grad_x[(u.b * a.T + j) * a.C + l.c] = from_acc<scalar_t>(sum);
  }
}

// ------------------------------------------------------------------------------------------------ sizes

// Forward launch shape for accumulators of `acc_bytes` bytes: kFwdWarps warps, tiles of 128 steps (32 for fp64),
// fewer when the windows of many heads per block (small R) would take more than a quarter of the 48 KiB budget,
// with the whole halo in shared memory when it fits the rest (else fewer rows, and the window ends past them are
// summed from x in global memory).
template <typename scalar_t>
void set_fwd_shape(TalkArgs<scalar_t>& a, int64_t acc_bytes) {
  a.warps = kFwdWarps;
  a.heads_max = min64(min64(a.H, kLanes), (kLanes - 1) / a.R + 2);
  a.tile = acc_bytes == 8 ? 32 : 128;
  while (a.tile > 1 && a.tile * a.heads_max * bytes_with_acc<WindowRows>(acc_bytes) > kSharedBudget / 4) a.tile /= 2;
  const int64_t windows = a.tile * a.heads_max * bytes_with_acc<WindowRows>(acc_bytes);
  const int64_t budget_rows = (kSharedBudget - windows) / (kLanes * acc_bytes) - kFwdWarps;
  a.rows = min64(a.tile + a.max_left + a.max_right + 1, budget_rows);
}

// Grad-x launch shape: tiles of 64 steps (fp32 accumulators) or 32 (fp64), 8 KiB of q per warp.
template <typename scalar_t>
void set_gx_shape(TalkArgs<scalar_t>& a, int64_t acc_bytes) {
  a.tile = 8 * 1024 / (kLanes * acc_bytes);
}

// Shared memory of one grad-x warp: q (tile x 32 accumulators), then 32 EndTargets.
template <typename scalar_t>
TALK_HD int64_t gx_q_bytes(const TalkArgs<scalar_t>& a, int64_t acc_bytes) {
  return a.tile * kLanes * acc_bytes;
}

template <typename scalar_t>
TALK_HD int64_t gx_warp_bytes(const TalkArgs<scalar_t>& a, int64_t acc_bytes) {
  return gx_q_bytes(a, acc_bytes) + kLanes * bytes_with_acc<EndTargets>(acc_bytes);
}

template <typename scalar_t>
int64_t gx_shared_bytes(const TalkArgs<scalar_t>& a, int64_t acc_bytes) {
  return kGradXWarps * gx_warp_bytes(a, acc_bytes);
}

}  // namespace tiles
}  // namespace talk_hf
