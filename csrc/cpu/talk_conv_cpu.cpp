// TaLK convolution on the CPU. Specification: talk_hf/talk_conv.py.
//
// Forward, one fused pass per task = (batch, tile of kTile time steps, span of channels: whole heads side by side,
// up to kRowSpan channels, see head_groups): compute the tile's window ends, build the prefix sums of just the rows
// those windows read (the tile plus its halo, usually max_left + max_right + 1 rows, whatever the offsets) in a
// buffer that stays in L2, and read every window from it. x is read about once, row by row, and the output written
// once, row by row (whole rows stream from and to memory: 1.3x faster at 32 MB tensors than a head at a time, whose
// 256-byte pieces of strided rows the buffer kept in L1); sums accumulate in the accumulation type (fp64 for fp64,
// fp32 otherwise) and start at each head's own first row read in the tile, so they stay short and round the same
// whichever heads share the task (the grouping depends on the thread count and the batch size).
//
// Backward, also one pass per (batch, time tile, head) after one pass that computes every window end: offset
// gradients from the one element of x inside each interpolated window end, grad x from a local scatter of the outputs whose windows straddle the tile
// followed by suffix sums (see backward_tile). Every output element is written by one task: no atomics, and the
// reduction order is fixed. (A task of whole rows, as in the forward, was 0-20% slower here: the scatter's
// read-modify-writes then go to a buffer in L2 instead of L1.)
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../checks.h"
#include "../talk_conv_math.h"
#include "../talk_conv_step.h"
#include "vector_clones.h"

namespace talk_hf {
namespace {

struct Dims {
  int64_t B, T, C, H, R, max_left, max_right;
  bool has_right;
};

template <typename scalar_t, typename acc_t>
WindowEnd<acc_t> left_end(const scalar_t* offset_left, const Dims& d, int64_t b, int64_t t, int64_t h) {
  return left_window_end(static_cast<acc_t>(offset_left[(b * d.T + t) * d.H + h]), d.max_left, t, d.T);
}

template <typename scalar_t, typename acc_t>
WindowEnd<acc_t> right_end(const scalar_t* offset_right, const Dims& d, int64_t b, int64_t t, int64_t h) {
  const acc_t offset = d.has_right ? static_cast<acc_t>(offset_right[(b * d.T + t) * d.H + h]) : acc_t(0);
  return right_window_end(d.has_right, offset, d.max_right, t, d.T);
}

constexpr int64_t kTile = 256;          // time steps per forward task
constexpr int64_t kBackwardTile = 128;  // time steps per backward task
constexpr int64_t kRowSpan = 512;       // channels per task: whole heads up to this width (see head_groups)
constexpr int64_t kTasksPerThread = 4;  // tasks per thread at least, before rows are split into narrower spans

// The channels of one forward task: heads [h0, h0 + nh), and of each the channels [c0, c0 + nc) (all of them when
// nh > 1: the task's channels are one contiguous span of a row).
struct Span {
  int64_t h0, nh, c0, nc;
};

// Window ends of the steps [t0, t1) of the heads [h0, h0 + nh): ends[2 (i nh + j)] (left) and ends[2 (i nh + j) + 1]
// (right) for step t0 + i, head h0 + j.
template <typename scalar_t, typename acc_t>
void window_ends(const scalar_t* offset_left, const scalar_t* offset_right, const Dims& d, int64_t b, int64_t h0,
                 int64_t nh, int64_t t0, int64_t t1, WindowEnd<acc_t>* ends) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t h = h0; h < h0 + nh; ++h) {
      *ends++ = left_end<scalar_t, acc_t>(offset_left, d, b, t, h);
      *ends++ = right_end<scalar_t, acc_t>(offset_right, d, b, t, h);
    }
  }
}

// The table rows [base, top] read by the window ends of `steps` steps of nh heads (laid out as by window_ends), and
// first[j], the first row that head j reads (any offsets: a negative one can put a left end past its right end, so
// all four rows count). base is the least first[j].
struct Rows {
  int64_t base, top;
};

template <typename acc_t>
Rows rows_read(const WindowEnd<acc_t>* ends, int64_t steps, int64_t nh, int64_t seqlen, int64_t* first) {
  Rows rows{seqlen, 0};
  std::fill(first, first + nh, seqlen);
  for (int64_t i = 0; i < steps; ++i) {
    for (int64_t j = 0; j < nh; ++j, ends += 2) {
      first[j] = std::min({first[j], ends[0].lo, ends[1].lo});
      rows.top = std::max({rows.top, ends[0].hi, ends[1].hi});
    }
  }
  rows.base = *std::min_element(first, first + nh);
  return rows;
}

// Local prefix sums of nh heads of nc channels side by side (the channels [c0, c0 + nh nc)) over the rows read, each
// head's from its own first row: buf[i * width + j * nc + c] = sat[base + i] - sat[first[j]] for base + i >= first[j]
// (0 before). Differences of table rows, all a window needs, are the same as from the whole table, and a head's values
// depend only on its own rows.
template <typename scalar_t, typename acc_t>
TALK_HF_VECTOR_CLONES void local_prefix_sums(const scalar_t* __restrict__ x, const Dims& d, int64_t b, Rows rows,
                                             const int64_t* first, int64_t c0, int64_t nh, int64_t nc,
                                             std::vector<acc_t>& buf) {
  const int64_t width = nh * nc;
  buf.resize((rows.top - rows.base + 1) * width);
  acc_t* __restrict__ p = buf.data();
  for (int64_t c = 0; c < width; ++c) p[c] = acc_t(0);
  const int64_t last_first = *std::max_element(first, first + nh);  // every head accumulates in the rows after it
  for (int64_t i = 1; i <= rows.top - rows.base; ++i) {
    const scalar_t* __restrict__ xi = x + (b * d.T + rows.base + i - 1) * d.C + c0;
    const acc_t* __restrict__ prev = p + (i - 1) * width;
    acc_t* __restrict__ cur = p + i * width;
    if (rows.base + i <= last_first) {  // a head whose first row is at or past this row stays 0 here
      for (int64_t j = 0; j < nh; ++j) {
        const int64_t k0 = j * nc, k1 = k0 + nc;
        if (rows.base + i <= first[j]) {
          std::fill(cur + k0, cur + k1, acc_t(0));
          continue;
        }
#pragma omp simd
        for (int64_t c = k0; c < k1; ++c) cur[c] = prev[c] + static_cast<acc_t>(xi[c]);
      }
      continue;
    }
#pragma omp simd
    for (int64_t c = 0; c < width; ++c) cur[c] = prev[c] + static_cast<acc_t>(xi[c]);
  }
}

// Forward of one task: time steps [t0, t1) of the span's channels; `ends`, `first` and `buf` are scratch.
template <typename scalar_t, typename acc_t>
TALK_HF_VECTOR_CLONES void forward_tile(const scalar_t* __restrict__ x, const scalar_t* offset_left,
                                        const scalar_t* offset_right, scalar_t* __restrict__ out, const Dims& d,
                                        int64_t b, int64_t t0, int64_t t1, Span s,
                                        std::vector<WindowEnd<acc_t>>& ends, std::vector<int64_t>& first,
                                        std::vector<acc_t>& buf) {
  window_ends<scalar_t, acc_t>(offset_left, offset_right, d, b, s.h0, s.nh, t0, t1, ends.data());
  const Rows rows = rows_read(ends.data(), t1 - t0, s.nh, d.T, first.data());
  const int64_t base = rows.base, width = s.nh * s.nc, c0 = s.h0 * d.R + s.c0;
  local_prefix_sums<scalar_t, acc_t>(x, d, b, rows, first.data(), c0, s.nh, s.nc, buf);
  const acc_t* p = buf.data();
  const acc_t inv_norm = acc_t(1) / static_cast<acc_t>(d.max_left + d.max_right + 1);
  const WindowEnd<acc_t>* e = ends.data();
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t j = 0; j < s.nh; ++j, e += 2) {
      const WindowEnd<acc_t> l = e[0], r = e[1];
      const acc_t* head = p + j * s.nc;
      const acc_t *__restrict__ llo = head + (l.lo - base) * width, *__restrict__ lhi = head + (l.hi - base) * width;
      const acc_t *__restrict__ rlo = head + (r.lo - base) * width, *__restrict__ rhi = head + (r.hi - base) * width;
      const acc_t lf = l.frac, rf = r.frac;
      scalar_t* __restrict__ o = out + (b * d.T + t) * d.C + c0 + j * s.nc;
#pragma omp simd
      for (int64_t c = 0; c < s.nc; ++c) {
        const acc_t left = llo[c] + lf * (lhi[c] - llo[c]);
        const acc_t right = rlo[c] + rf * (rhi[c] - rlo[c]);
        o[c] = static_cast<scalar_t>((right - left) * inv_norm);
      }
    }
  }
}

// The channels of the forward tasks: `heads` whole heads per task (rows of x read and written as one contiguous span
// of up to kRowSpan channels), `count` groups of them per row; a head wider than kRowSpan is split into `blocks` of
// `block` channels. Heads are grouped only while every thread keeps kTasksPerThread tasks.
struct Groups {
  int64_t heads, count, block, blocks;
};

Groups head_groups(const Dims& d, int64_t tiles) {
  int64_t heads = std::clamp<int64_t>(kRowSpan / std::max<int64_t>(d.R, 1), 1, d.H);
  const int64_t wanted = kTasksPerThread * at::get_num_threads();
  while (heads > 1 && d.B * tiles * cdiv(d.H, heads) < wanted) heads = cdiv(heads, 2);
  const int64_t block = std::min(kRowSpan, d.R);
  return {heads, cdiv(d.H, heads), block, cdiv(d.R, block)};
}

template <typename scalar_t>
void forward_kernel(const at::Tensor& x, const at::Tensor& ol, const at::Tensor& orr, at::Tensor& out,
                    const Dims& d) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* xp = x.data_ptr<scalar_t>();
  const scalar_t* olp = ol.data_ptr<scalar_t>();
  const scalar_t* orp = d.has_right ? orr.data_ptr<scalar_t>() : nullptr;
  scalar_t* outp = out.data_ptr<scalar_t>();
  const int64_t tiles = cdiv(d.T, kTile);
  const Groups groups = head_groups(d, tiles);
  at::parallel_for(0, d.B * tiles * groups.count * groups.blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<WindowEnd<acc_t>> ends(2 * kTile * groups.heads);
    std::vector<int64_t> first(groups.heads);
    std::vector<acc_t> buf;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t block = task % groups.blocks, h0 = task / groups.blocks % groups.count * groups.heads;
      const int64_t tile = task / (groups.blocks * groups.count) % tiles;
      const int64_t b = task / (groups.blocks * groups.count * tiles), t0 = tile * kTile, c0 = block * groups.block;
      const Span s{h0, std::min(groups.heads, d.H - h0), c0, std::min(groups.block, d.R - c0)};
      forward_tile<scalar_t, acc_t>(xp, olp, orp, outp, d, b, t0, std::min(d.T, t0 + kTile), s, ends, first, buf);
    }
  });
}

// Rows of the summed-area table that the windows of one (b, h) read, relative to t: [t - before, t + after].
struct Reach {
  int64_t before = 0, after = 0;
};

// Backward of one task: time steps [t0, t1) of head h (all its channels).
//  - offset gradients of the outputs t in [t0, t1): the slope of an interpolated window end is one element of x;
//  - grad x of the positions j in [t0, t1): grad x_j = sum over table rows i >= j + 1 of the table gradient. An
//    output whose window rows all lie at or after t1 adds +w and -w to that suffix sum (its two ends' weights each
//    sum to 1) and one whose rows all lie at or before t0 adds nothing, so only the outputs in
//    [t0 + 1 - after, t1 - 1 + before] are scattered, into a local table of the rows > t0.
template <typename scalar_t, typename acc_t>
TALK_HF_VECTOR_CLONES void backward_tile(const scalar_t* __restrict__ g, const scalar_t* __restrict__ x,
                                         const WindowEnd<acc_t>* ends, Reach reach, scalar_t* __restrict__ gx,
                                         scalar_t* gol, scalar_t* gor, const Dims& d, int64_t b, int64_t h,
                                         int64_t t0, int64_t t1, std::vector<acc_t>& buf) {
  const acc_t inv_norm = acc_t(1) / static_cast<acc_t>(d.max_left + d.max_right + 1);
  const int64_t R = d.R, c0 = h * d.R;
  ends += (b * d.H + h) * d.T * 2;  // this head's ends, step by step
  auto end_at = [&](int64_t t, int side) { return ends[2 * t + side]; };

  // offset gradients: the slope S[hi] - S[lo] of an interpolated end is the one element x[lo] between its rows
  // (zero when clamped or on an integer position, where hi == lo)
  const scalar_t* xb = x + b * d.T * d.C + c0;
  for (int64_t t = t0; t < t1; ++t) {
    const WindowEnd<acc_t> l = end_at(t, 0), r = end_at(t, 1);
    const scalar_t* __restrict__ gt = g + (b * d.T + t) * d.C + c0;
    acc_t slope_left = 0, slope_right = 0;
    if (l.hi != l.lo) {
      const scalar_t* __restrict__ xl = xb + l.lo * d.C;
#pragma omp simd reduction(+ : slope_left)
      for (int64_t c = 0; c < R; ++c) slope_left += static_cast<acc_t>(gt[c]) * static_cast<acc_t>(xl[c]);
    }
    if (r.hi != r.lo) {
      const scalar_t* __restrict__ xr = xb + r.lo * d.C;
#pragma omp simd reduction(+ : slope_right)
      for (int64_t c = 0; c < R; ++c) slope_right += static_cast<acc_t>(gt[c]) * static_cast<acc_t>(xr[c]);
    }
    gol[(b * d.T + t) * d.H + h] = static_cast<scalar_t>(slope_left * inv_norm * static_cast<acc_t>(d.max_left));
    if (d.has_right)
      gor[(b * d.T + t) * d.H + h] = static_cast<scalar_t>(slope_right * inv_norm * static_cast<acc_t>(d.max_right));
  }

  // grad x: local table gradient of the rows (t0, last]
  const int64_t first_t = std::max<int64_t>(0, t0 + 1 - reach.after);
  const int64_t last_t = std::min<int64_t>(d.T - 1, t1 - 1 + reach.before);
  const int64_t last = std::min<int64_t>(d.T, std::max(t1, last_t + reach.after));  // grad x_{t1-1} reads row t1
  buf.assign((last - t0) * R, acc_t(0));
  acc_t* __restrict__ q = buf.data();  // q[(i - t0 - 1) * R + c] for table row i in (t0, last]
  for (int64_t t = first_t; t <= last_t; ++t) {
    const WindowEnd<acc_t> l = end_at(t, 0), r = end_at(t, 1);
    const scalar_t* __restrict__ gt = g + (b * d.T + t) * d.C + c0;
    const int64_t rows[4] = {l.lo, l.hi, r.lo, r.hi};
    const acc_t weights[4] = {-(acc_t(1) - l.frac), -l.frac, acc_t(1) - r.frac, r.frac};
    for (int k = 0; k < 4; ++k) {
      if (rows[k] <= t0 || weights[k] == acc_t(0)) continue;
      acc_t* __restrict__ row = q + (rows[k] - t0 - 1) * R;
      const acc_t w = weights[k] * inv_norm;
#pragma omp simd
      for (int64_t c = 0; c < R; ++c) row[c] += w * static_cast<acc_t>(gt[c]);
    }
  }
  for (int64_t i = last - 1; i > t0; --i) {  // suffix sums: row i holds the sum of rows >= i
    acc_t* __restrict__ row = q + (i - t0 - 1) * R;
    const acc_t* __restrict__ next = row + R;
#pragma omp simd
    for (int64_t c = 0; c < R; ++c) row[c] += next[c];
  }
  for (int64_t j = t0; j < t1; ++j) {  // grad x_j = suffix sum at row j + 1
    const acc_t* __restrict__ row = q + (j - t0) * R;
    scalar_t* __restrict__ out = gx + (b * d.T + j) * d.C + c0;
#pragma omp simd
    for (int64_t c = 0; c < R; ++c) out[c] = static_cast<scalar_t>(row[c]);
  }
}

template <typename scalar_t>
void backward_kernel(const at::Tensor& g, const at::Tensor& x, const at::Tensor& ol, const at::Tensor& orr,
                     at::Tensor& gx, at::Tensor& gol, at::Tensor& gor, const Dims& d) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* olp = ol.data_ptr<scalar_t>();
  const scalar_t* orp = d.has_right ? orr.data_ptr<scalar_t>() : nullptr;
  // every window end once, laid out (b, h, t), and how far each (b, h)'s windows reach
  std::vector<WindowEnd<acc_t>> ends(d.B * d.H * d.T * 2);
  std::vector<Reach> reach(d.B * d.H);
  at::parallel_for(0, d.B * d.H, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      WindowEnd<acc_t>* e = ends.data() + bh * d.T * 2;
      window_ends<scalar_t, acc_t>(olp, orp, d, bh / d.H, bh % d.H, 1, 0, d.T, e);
      Reach& rc = reach[bh];
      for (int64_t t = 0; t < d.T; ++t) {
        rc.before = std::max(rc.before, rows_before(t, e[2 * t], e[2 * t + 1]));
        rc.after = std::max(rc.after, rows_after(t, e[2 * t], e[2 * t + 1]));
      }
    }
  });
  const int64_t tiles = cdiv(d.T, kBackwardTile);
  const scalar_t *gp = g.data_ptr<scalar_t>(), *xp = x.data_ptr<scalar_t>();
  scalar_t *gxp = gx.data_ptr<scalar_t>(), *golp = gol.data_ptr<scalar_t>();
  scalar_t* gorp = d.has_right ? gor.data_ptr<scalar_t>() : nullptr;
  at::parallel_for(0, d.B * tiles * d.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> buf;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t h = task % d.H, tile = task / d.H % tiles, b = task / (d.H * tiles);
      const int64_t t0 = tile * kBackwardTile;
      backward_tile<scalar_t, acc_t>(gp, xp, ends.data(), reach[b * d.H + h], gxp, golp, gorp, d, b, h, t0,
                                     std::min(d.T, t0 + kBackwardTile), buf);
    }
  });
}

Dims make_dims(const at::Tensor& x, const at::Tensor& ol, bool has_right, int64_t max_left, int64_t max_right) {
  const int64_t H = ol.size(2);
  return {x.size(0), x.size(1), x.size(2), H, x.size(2) / H, max_left, max_right, has_right};
}

at::Tensor talk_conv_fwd_cpu(const at::Tensor& x_, const at::Tensor& ol_, const c10::optional<at::Tensor>& or_,
                             int64_t max_left, int64_t max_right) {
  check_talk_conv_inputs(x_, ol_, or_, max_left, max_right);
  const at::Tensor x = x_.contiguous(), ol = ol_.contiguous();
  const at::Tensor orr = contiguous_or_undefined(or_);
  at::Tensor out = at::empty_like(x);
  const Dims d = make_dims(x, ol, or_.has_value(), max_left, max_right);
  if (x.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "talk_conv_fwd_cpu",
                                  [&] { forward_kernel<scalar_t>(x, ol, orr, out, d); });
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> talk_conv_bwd_cpu(const at::Tensor& g_, const at::Tensor& x_,
                                                                 const at::Tensor& ol_,
                                                                 const c10::optional<at::Tensor>& or_,
                                                                 int64_t max_left, int64_t max_right) {
  check_talk_conv_inputs(x_, ol_, or_, max_left, max_right);
  TORCH_CHECK(g_.sizes() == x_.sizes() && g_.scalar_type() == x_.scalar_type(),
              "talk_conv backward: grad_out must match x");
  const at::Tensor g = g_.contiguous(), x = x_.contiguous(), ol = ol_.contiguous();
  const at::Tensor orr = contiguous_or_undefined(or_);
  at::Tensor gx = at::empty_like(x), gol = at::empty_like(ol);
  at::Tensor gor = or_.has_value() ? at::empty_like(ol) : at::empty({0}, ol.options());
  const Dims d = make_dims(x, ol, or_.has_value(), max_left, max_right);
  if (x.numel() == 0) return {gx, gol.zero_(), gor.zero_()};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "talk_conv_bwd_cpu",
                                  [&] { backward_kernel<scalar_t>(g, x, ol, orr, gx, gol, gor, d); });
  return {gx, gol, gor};
}

// Decoding step(s) of one batch row, row by row (the CUDA kernel runs talk_conv_step.h's column program instead;
// same arithmetic). ext: (r + T) x C scratch.
template <typename scalar_t>
TALK_HF_VECTOR_CLONES void step_batch_row(const TalkStepArgs<scalar_t>& a, int64_t b, acc_type<scalar_t>* ext) {
  using acc_t = acc_type<scalar_t>;
  const int64_t r = a.max_left + 2, C = a.C, R = a.C / a.H;
  std::copy(a.state + b * r * C, a.state + (b + 1) * r * C, ext);
  for (int64_t t = 0; t < a.T; ++t) {  // ext row r + t = S after new token t
    const acc_t* __restrict__ prev = ext + (r + t - 1) * C;
    acc_t* __restrict__ row = ext + (r + t) * C;
    const scalar_t* __restrict__ xt = a.x + (b * a.T + t) * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) row[c] = prev[c] + static_cast<acc_t>(xt[c]);
  }
  const acc_t norm = static_cast<acc_t>(a.max_left + 1);
  for (int64_t t = 0; t < a.T; ++t) {
    for (int64_t h = 0; h < a.H; ++h) {
      const acc_t offset = static_cast<acc_t>(a.offset_left[(b * a.T + t) * a.H + h]);
      const StepEnd<acc_t> l = step_left_end(offset, a.max_left, t);
      const acc_t frac = l.frac;
      const int64_t hi = l.lo + (frac > acc_t(0) ? 1 : 0);
      const acc_t *__restrict__ at_lo = ext + l.lo * C + h * R, *__restrict__ at_hi = ext + hi * C + h * R;
      const acc_t* __restrict__ now = ext + (r + t) * C + h * R;
      scalar_t* __restrict__ out = a.out + (b * a.T + t) * C + h * R;
#pragma omp simd
      for (int64_t c = 0; c < R; ++c)
        out[c] = static_cast<scalar_t>((now[c] - (at_lo[c] + frac * (at_hi[c] - at_lo[c]))) / norm);
    }
  }
  const acc_t* __restrict__ base = ext + (a.T - 1) * C;  // the row before the new state's first row
  for (int64_t i = 0; i < r; ++i) {
    const acc_t* __restrict__ row = ext + (a.T + i) * C;
    acc_t* __restrict__ dst = a.new_state + (b * r + i) * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dst[c] = row[c] - base[c];
  }
}

std::tuple<at::Tensor, at::Tensor> talk_conv_step_cpu(const at::Tensor& x_, const at::Tensor& ol_,
                                                      const at::Tensor& state_, int64_t max_left) {
  check_talk_conv_step_inputs(x_, ol_, state_, max_left);
  const at::Tensor x = x_.contiguous(), ol = ol_.contiguous(), state = state_.contiguous();
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), r = max_left + 2;
  at::Tensor out = at::empty_like(x), new_state = at::empty_like(state);
  if (T == 0 || B == 0 || C == 0) return {out, new_state.copy_(state)};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "talk_conv_step_cpu", [&] {
    using acc_t = acc_type<scalar_t>;
    const TalkStepArgs<scalar_t> a{x.data_ptr<scalar_t>(), ol.data_ptr<scalar_t>(), state.data_ptr<acc_t>(),
                                   out.data_ptr<scalar_t>(), new_state.data_ptr<acc_t>(), nullptr,
                                   B, T, C, ol.size(2), max_left};
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 18) / ((r + T) * C));  // >= 256K elements per task
    at::parallel_for(0, B, grain, [&](int64_t begin, int64_t end) {
      std::vector<acc_t> ext((r + T) * C);
      for (int64_t b = begin; b < end; ++b) step_batch_row(a, b, ext.data());
    });
  });
  return {out, new_state};
}

}  // namespace

TORCH_LIBRARY_IMPL(talk_hf, CPU, m) {
  m.impl("talk_conv_fwd", &talk_conv_fwd_cpu);
  m.impl("talk_conv_bwd", &talk_conv_bwd_cpu);
  m.impl("talk_conv_step", &talk_conv_step_cpu);
}

}  // namespace talk_hf
