// Random feature map of RFA on the GPU (specification: talk_hf/rfa.py, `rfa_feature_map_ref`). The arithmetic of a
// row is csrc/rfa_features.h, shared with the CPU kernel that the tests run. One thread per (row, frequency):
// the row's scale (|x| over d entries, read from L1 by every thread of the row), the dot product with row f of
// W_h, then features 2f and 2f + 1. Blocks cover kFrequenciesPerBlock frequencies of one row.
#include "common.cuh"
#include "../rfa_features.h"
#include "../talk_hf_kernels.h"

namespace talk_hf {
namespace {

using namespace cuda_detail;

constexpr int kFrequenciesPerBlock = 128;

template <typename acc_t>
struct FeatureArgs {
  const acc_t* x;           // (rows, d)
  const acc_t* projection;  // (H, D, d)
  const acc_t* tau;         // (H,) or nullptr
  acc_t* out;               // (rows, 2D)
  int64_t heads, frequencies, head_dim;
};

template <typename acc_t>
__global__ void __launch_bounds__(kFrequenciesPerBlock) rfa_feature_map_kernel(const FeatureArgs<acc_t> a) {
  const int64_t row = blockIdx.x;
  const int64_t f = static_cast<int64_t>(blockIdx.y) * kFrequenciesPerBlock + threadIdx.x;
  if (f >= a.frequencies) return;
  const int64_t h = row % a.heads, d = a.head_dim;
  const acc_t* x = a.x + row * d;
  const acc_t scale = rfa_feature_row_scale(x, d, a.tau != nullptr ? a.tau[h] : acc_t(1));
  const acc_t* w = a.projection + (h * a.frequencies + f) * d;
  acc_t dot = 0;
  for (int64_t c = 0; c < d; ++c) dot += w[c] * x[c];
  rfa_feature_pair(dot * scale, a.out + row * 2 * a.frequencies + 2 * f);
}

template <typename acc_t>
cudaError_t launch(const RfaFeatureParams& p, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(p.rows), static_cast<unsigned>(cdiv(p.frequencies, kFrequenciesPerBlock)));
  rfa_feature_map_kernel<acc_t><<<grid, kFrequenciesPerBlock, 0, stream>>>(FeatureArgs<acc_t>{
      static_cast<const acc_t*>(p.x), static_cast<const acc_t*>(p.projection), static_cast<const acc_t*>(p.tau),
      static_cast<acc_t*>(p.out), p.heads, p.frequencies, p.head_dim});
  return cudaGetLastError();
}

}  // namespace

cudaError_t rfa_feature_map_cuda(const RfaFeatureParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.frequencies == 0) return cudaSuccess;
  if ((p.dtype != DType::kFloat32 && p.dtype != DType::kFloat64) || p.heads <= 0 || p.rows % p.heads != 0 ||
      p.rows > 0x7fffffff || cdiv(p.frequencies, kFrequenciesPerBlock) > 65535 || p.x == nullptr ||
      p.projection == nullptr || p.out == nullptr)
    return cudaErrorInvalidValue;
  return p.dtype == DType::kFloat32 ? launch<float>(p, stream) : launch<double>(p, stream);
}

}  // namespace talk_hf
