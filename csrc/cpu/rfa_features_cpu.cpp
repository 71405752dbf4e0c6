// Random feature map of RFA on the CPU (specification: talk_hf/rfa.py, `rfa_feature_map_ref`; the per-row
// arithmetic is csrc/rfa_features.h, shared with the CUDA kernel). One task per group of (b, t, h) rows: the D
// projections of a row (dot products of d), then their sines and cosines, D at a time (vectorised polynomials).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "../checks.h"
#include "../rfa_features.h"
#include "vector_clones.h"

namespace talk_hf {
namespace {

struct FeatureDims {
  int64_t H, D, d;  // heads, frequencies (features 2D), head dim
};

// Rows [begin, end) of the (B * T * H, d) input: features (rows, 2D); u is D entries of scratch.
template <typename acc_t>
TALK_HF_VECTOR_CLONES void feature_rows(const acc_t* __restrict__ x, const acc_t* __restrict__ projection,
                                        const acc_t* tau, acc_t* __restrict__ out, const FeatureDims& n,
                                        int64_t begin, int64_t end, acc_t* __restrict__ u) {
  for (int64_t row = begin; row < end; ++row) {
    const int64_t h = row % n.H;
    const acc_t* __restrict__ xr = x + row * n.d;
    const acc_t scale = rfa_feature_row_scale(xr, n.d, tau != nullptr ? tau[h] : acc_t(1));
    for (int64_t f = 0; f < n.D; ++f) {
      const acc_t* __restrict__ w = projection + (h * n.D + f) * n.d;
      acc_t dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t c = 0; c < n.d; ++c) dot += w[c] * xr[c];
      u[f] = dot * scale;
    }
    acc_t* __restrict__ o = out + row * 2 * n.D;
#pragma omp simd
    for (int64_t f = 0; f < n.D; ++f) rfa_feature_pair(u[f], o + 2 * f);
  }
}

at::Tensor rfa_feature_map_cpu(const at::Tensor& x_, const at::Tensor& projection_,
                               const c10::optional<at::Tensor>& tau_) {
  check_rfa_feature_map_inputs(x_, projection_, tau_);
  const at::Tensor x = x_.contiguous(), projection = projection_.contiguous();
  const at::Tensor tau = contiguous_or_undefined(tau_);
  const FeatureDims n{x.size(2), projection.size(1), x.size(3)};
  at::Tensor out = at::empty({x.size(0), x.size(1), n.H, 2 * n.D}, x.options());
  const int64_t rows = x.size(0) * x.size(1) * n.H;
  if (out.numel() == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rfa_feature_map_cpu", [&] {
    const scalar_t* tp = tau.defined() ? tau.data_ptr<scalar_t>() : nullptr;
    const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, n.D * n.d));  // >= 16K multiply-adds
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> u(n.D);
      feature_rows<scalar_t>(x.data_ptr<scalar_t>(), projection.data_ptr<scalar_t>(), tp, out.data_ptr<scalar_t>(),
                             n, begin, end, u.data());
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(talk_hf, CPU, m) { m.impl("rfa_feature_map", &rfa_feature_map_cpu); }

}  // namespace talk_hf
