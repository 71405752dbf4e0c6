// Random feature map of RFA on the CPU (specification: talk_hf/rfa.py, `rfa_feature_map_ref`; the per-row
// arithmetic is csrc/rfa_features.h, shared with the CUDA kernel). The projections of every row are one batched
// matrix product per head (ATen's GEMM, about ten times the speed of taking a row's D dot products of d one at a
// time), then one task per group of (b, t, h) rows scales them and writes their sines and cosines,
// D at a time (vectorised polynomials).
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <algorithm>

#include "../checks.h"
#include "../rfa_features.h"
#include "vector_clones.h"

namespace talk_hf {
namespace {

struct FeatureDims {
  int64_t H, D, d, R;  // heads, frequencies (features 2D), head dim, rows per head (B * T)
};

// Rows [begin, end) of the (B * T * H, d) input x (row = r * H + h): features (rows, 2D) from the (H, R, D)
// projections u.
template <typename acc_t>
TALK_HF_VECTOR_CLONES void feature_rows(const acc_t* __restrict__ x, const acc_t* __restrict__ u, const acc_t* tau,
                                        acc_t* __restrict__ out, const FeatureDims& n, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    const int64_t h = row % n.H, r = row / n.H;
    const acc_t scale = rfa_feature_row_scale(x + row * n.d, n.d, tau != nullptr ? tau[h] : acc_t(1));
    const acc_t* __restrict__ ur = u + (h * n.R + r) * n.D;
    acc_t* __restrict__ o = out + row * 2 * n.D;
#pragma omp simd
    for (int64_t f = 0; f < n.D; ++f) rfa_feature_pair(ur[f] * scale, o + 2 * f);
  }
}

at::Tensor rfa_feature_map_cpu(const at::Tensor& x_, const at::Tensor& projection,
                               const c10::optional<at::Tensor>& tau_) {
  check_rfa_feature_map_inputs(x_, projection, tau_);
  const at::Tensor x = x_.contiguous();
  const at::Tensor tau = contiguous_or_undefined(tau_);
  const FeatureDims n{x.size(2), projection.size(1), x.size(3), x.size(0) * x.size(1)};
  at::Tensor out = at::empty({x.size(0), x.size(1), n.H, 2 * n.D}, x.options());
  if (out.numel() == 0) return out;
  // (H, R, d) @ (H, d, D): every row's D projections, unscaled, in x's dtype even inside an autocast region
  // (autocast would hand back a bf16 or fp16 product)
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const at::Tensor u = at::matmul(x.view({n.R, n.H, n.d}).transpose(0, 1), projection.transpose(1, 2));
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "rfa_feature_map_cpu", [&] {
    const scalar_t* tp = tau.defined() ? tau.data_ptr<scalar_t>() : nullptr;
    const int64_t grain = std::max<int64_t>(1, 4096 / n.D);  // >= 4K sine/cosine pairs per task
    at::parallel_for(0, n.R * n.H, grain, [&](int64_t begin, int64_t end) {
      feature_rows<scalar_t>(x.data_ptr<scalar_t>(), u.data_ptr<scalar_t>(), tp, out.data_ptr<scalar_t>(), n, begin,
                             end);
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(talk_hf, CPU, m) { m.impl("rfa_feature_map", &rfa_feature_map_cpu); }

}  // namespace talk_hf
