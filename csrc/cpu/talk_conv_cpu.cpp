// TaLK convolution on the CPU. One task per (batch, head): build that head's summed-area table in the
// accumulation type (fp64 for fp64, fp32 otherwise), then read every window from it. Backward scatters into a
// table of the same shape and finishes with a reverse cumulative sum, so there are no atomics and the
// reduction order is fixed. Specification: talk_hf/talk_conv.py.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include <vector>

#include "../checks.h"
#include "../talk_conv_math.h"

namespace talk_hf {
namespace {

struct Dims {
  int64_t B, T, C, H, R, max_left, max_right;
  bool has_right;
};

// sat[i * R + r] = S_{i-1} of channel r of this head (row 0 is S_{-1} = 0).
template <typename scalar_t, typename acc_t>
void build_sat(const scalar_t* x, const Dims& d, int64_t b, int64_t h, acc_t* sat) {
  for (int64_t r = 0; r < d.R; ++r) sat[r] = acc_t(0);
  for (int64_t t = 0; t < d.T; ++t) {
    const scalar_t* xt = x + (b * d.T + t) * d.C + h * d.R;
    const acc_t* prev = sat + t * d.R;
    acc_t* cur = sat + (t + 1) * d.R;
    for (int64_t r = 0; r < d.R; ++r) cur[r] = prev[r] + static_cast<acc_t>(xt[r]);
  }
}

template <typename scalar_t, typename acc_t>
WindowEnd<acc_t> left_end(const scalar_t* offset_left, const Dims& d, int64_t b, int64_t t, int64_t h) {
  const acc_t rel = -static_cast<acc_t>(offset_left[(b * d.T + t) * d.H + h]) * static_cast<acc_t>(d.max_left);
  return window_end<acc_t>(t, rel, d.T);  // S~(l - 1) reads sat[lo], sat[hi]
}

// Right end as indices into sat (shifted by one row): S~(r) reads sat[lo], sat[hi]. Causal: sat[t + 1].
template <typename scalar_t, typename acc_t>
WindowEnd<acc_t> right_end(const scalar_t* offset_right, const Dims& d, int64_t b, int64_t t, int64_t h) {
  if (!d.has_right) return {t + 1, t + 1, acc_t(0)};
  const acc_t rel = static_cast<acc_t>(offset_right[(b * d.T + t) * d.H + h]) * static_cast<acc_t>(d.max_right);
  WindowEnd<acc_t> w = window_end<acc_t>(t, rel, d.T);
  return {w.lo + 1, w.hi + 1, w.frac};
}

template <typename scalar_t>
void forward_kernel(const at::Tensor& x, const at::Tensor& ol, const at::Tensor& orr, at::Tensor& out,
                    const Dims& d) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* xp = x.data_ptr<scalar_t>();
  const scalar_t* olp = ol.data_ptr<scalar_t>();
  const scalar_t* orp = d.has_right ? orr.data_ptr<scalar_t>() : nullptr;
  scalar_t* outp = out.data_ptr<scalar_t>();
  const acc_t inv_norm = acc_t(1) / static_cast<acc_t>(d.max_left + d.max_right + 1);
  at::parallel_for(0, d.B * d.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> sat((d.T + 1) * d.R);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / d.H, h = bh % d.H;
      build_sat(xp, d, b, h, sat.data());
      for (int64_t t = 0; t < d.T; ++t) {
        const WindowEnd<acc_t> l = left_end<scalar_t, acc_t>(olp, d, b, t, h);
        const WindowEnd<acc_t> r = right_end<scalar_t, acc_t>(orp, d, b, t, h);
        const acc_t *llo = &sat[l.lo * d.R], *lhi = &sat[l.hi * d.R];
        const acc_t *rlo = &sat[r.lo * d.R], *rhi = &sat[r.hi * d.R];
        scalar_t* o = outp + (b * d.T + t) * d.C + h * d.R;
        for (int64_t c = 0; c < d.R; ++c) {
          const acc_t left = llo[c] + l.frac * (lhi[c] - llo[c]);
          const acc_t right = rlo[c] + r.frac * (rhi[c] - rlo[c]);
          o[c] = static_cast<scalar_t>((right - left) * inv_norm);
        }
      }
    }
  });
}

template <typename scalar_t>
void backward_kernel(const at::Tensor& g, const at::Tensor& x, const at::Tensor& ol, const at::Tensor& orr,
                     at::Tensor& gx, at::Tensor& gol, at::Tensor& gor, const Dims& d) {
  using acc_t = at::opmath_type<scalar_t>;
  const scalar_t* gp = g.data_ptr<scalar_t>();
  const scalar_t* xp = x.data_ptr<scalar_t>();
  const scalar_t* olp = ol.data_ptr<scalar_t>();
  const scalar_t* orp = d.has_right ? orr.data_ptr<scalar_t>() : nullptr;
  scalar_t* gxp = gx.data_ptr<scalar_t>();
  scalar_t* golp = gol.data_ptr<scalar_t>();
  scalar_t* gorp = d.has_right ? gor.data_ptr<scalar_t>() : nullptr;
  const acc_t inv_norm = acc_t(1) / static_cast<acc_t>(d.max_left + d.max_right + 1);
  at::parallel_for(0, d.B * d.H, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> sat((d.T + 1) * d.R), gsat((d.T + 1) * d.R);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / d.H, h = bh % d.H;
      build_sat(xp, d, b, h, sat.data());
      std::fill(gsat.begin(), gsat.end(), acc_t(0));
      for (int64_t t = 0; t < d.T; ++t) {
        const WindowEnd<acc_t> l = left_end<scalar_t, acc_t>(olp, d, b, t, h);
        const WindowEnd<acc_t> r = right_end<scalar_t, acc_t>(orp, d, b, t, h);
        const scalar_t* gt = gp + (b * d.T + t) * d.C + h * d.R;
        acc_t slope_left = 0, slope_right = 0;
        for (int64_t c = 0; c < d.R; ++c) {
          const acc_t gv = static_cast<acc_t>(gt[c]) * inv_norm;
          gsat[l.lo * d.R + c] -= (acc_t(1) - l.frac) * gv;
          gsat[l.hi * d.R + c] -= l.frac * gv;
          gsat[r.lo * d.R + c] += (acc_t(1) - r.frac) * gv;
          gsat[r.hi * d.R + c] += r.frac * gv;
          slope_left += gv * (sat[l.hi * d.R + c] - sat[l.lo * d.R + c]);
          slope_right += gv * (sat[r.hi * d.R + c] - sat[r.lo * d.R + c]);
        }
        golp[(b * d.T + t) * d.H + h] = static_cast<scalar_t>(slope_left * static_cast<acc_t>(d.max_left));
        if (d.has_right)
          gorp[(b * d.T + t) * d.H + h] = static_cast<scalar_t>(slope_right * static_cast<acc_t>(d.max_right));
      }
      // grad x_j = sum of gsat rows i >= j + 1 (row 0 belongs to the constant S_{-1}).
      for (int64_t c = 0; c < d.R; ++c) {
        acc_t running = 0;
        for (int64_t j = d.T - 1; j >= 0; --j) {
          running += gsat[(j + 1) * d.R + c];
          gxp[(b * d.T + j) * d.C + h * d.R + c] = static_cast<scalar_t>(running);
        }
      }
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
  const at::Tensor orr = or_.has_value() ? or_->contiguous() : at::Tensor();
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
  const at::Tensor orr = or_.has_value() ? or_->contiguous() : at::Tensor();
  at::Tensor gx = at::empty_like(x), gol = at::empty_like(ol);
  at::Tensor gor = or_.has_value() ? at::empty_like(ol) : at::empty({0}, ol.options());
  const Dims d = make_dims(x, ol, or_.has_value(), max_left, max_right);
  if (x.numel() == 0) return {gx, gol.zero_(), gor.zero_()};
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "talk_conv_bwd_cpu",
                                  [&] { backward_kernel<scalar_t>(g, x, ol, orr, gx, gol, gor, d); });
  return {gx, gol, gor};
}

}  // namespace

TORCH_LIBRARY_IMPL(talk_hf, CPU, m) {
  m.impl("talk_conv_fwd", &talk_conv_fwd_cpu);
  m.impl("talk_conv_bwd", &talk_conv_bwd_cpu);
}

}  // namespace talk_hf
