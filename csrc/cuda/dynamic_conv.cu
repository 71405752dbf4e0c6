// CUDA kernels of the dynamic / lightweight convolution. Specification: talk_hf/dynamic_conv.py
// (`dynamic_conv_ref`); layouts and the per-element programs in csrc/dynamic_conv_math.h.
//
// Forward:  one thread per (b, t, c) (conv_fwd_element: a gather over the in-range taps).
// Backward: grad_x: one thread per (b, s, c) (conv_grad_x_element: a gather, no atomics).
//           grad_weight: one group of G lanes per (b, t, h) (G = power of two >= min(R, 32)); for each k the lanes
//           stride over the head's R channels (conv_grad_weight_partial) and a group shuffle reduction gives the
//           sum (deterministic).
// Decoding step: one thread per column (b, c) runs dynamic_conv_step.h's column program.
// softmax=true (weight holds logits, softmax_row.h): the forward and the step normalise the row of their (b, t, h)
// in registers (each thread reads the K logits of its row, a broadcast within the head); the backward writes the
// probabilities and the raw tap gradients gp to a workspace (2 x B*T*H*K accumulators), runs grad_x on the
// probabilities, then one thread per row turns gp into the logits' gradient p * (gp - sum p gp).
#include "common.cuh"
#include "../dynamic_conv_math.h"
#include "../dynamic_conv_step.h"
#include "../softmax_row.h"
#include "../talk_hf_kernels.h"

namespace talk_hf {
namespace {

using namespace cuda_detail;

inline ConvDims make_dims(const DynamicConvParams& p) {
  ConvDims d;
  d.B = p.batch;
  d.T = p.seqlen;
  d.C = p.channels;
  d.H = p.heads;
  d.R = p.channels / p.heads;
  d.K = p.kernel_size;
  const int64_t bound = p.seqlen + p.kernel_size;  // keeps t + k - P and s + P free of int64 overflow
  d.P = p.padding_left < -bound ? -bound : (p.padding_left > bound ? bound : p.padding_left);
  d.softmax = p.softmax;
  d.ws = p.weight_broadcast ? 0 : p.heads * p.kernel_size;
  return d;
}

inline bool is_empty(const DynamicConvParams& p) { return p.batch == 0 || p.seqlen == 0 || p.channels == 0; }

inline bool valid_common(const DynamicConvParams& p) {
  return valid_dtype(p.dtype) && p.batch > 0 && p.seqlen > 0 && p.channels > 0 && p.heads > 0 &&
         p.channels % p.heads == 0 && p.kernel_size >= 1 && p.x != nullptr && p.weight != nullptr;
}

// ------------------------------------------------------------------------------------------------ kernels

template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    dynamic_conv_fwd_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ weight,
                            scalar_t* __restrict__ out, ConvDims d) {
  for (int64_t n = global_thread_id(); n < d.B * d.T * d.C; n += global_thread_count())
    conv_fwd_element(x, weight, out, d, n);
}

// probs[row*K + k] = softmax of the row's logits, one thread per row: the B*T*H rows of the weights, or the H rows
// of a LightConv kernel (ws = 0); probs is laid out as the weights.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_kernel(const scalar_t* __restrict__ logits, acc_type<scalar_t>* __restrict__ probs, ConvDims d) {
  const int64_t rows = (d.ws != 0 ? d.B * d.T : 1) * d.H;
  for (int64_t row = global_thread_id(); row < rows; row += global_thread_count())
    softmax_probs_row(logits + row * d.K, d.K, probs + row * d.K);
}

// grad_logits[row*K + k] = p_k * (gp_k - sum_j p_j gp_j), one thread per row.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    softmax_grad_kernel(const acc_type<scalar_t>* __restrict__ probs, const acc_type<scalar_t>* __restrict__ gp,
                        scalar_t* __restrict__ grad_logits, ConvDims d) {
  for (int64_t row = global_thread_id(); row < d.B * d.T * d.H; row += global_thread_count()) {
    const int64_t bt = row / d.H;
    const acc_type<scalar_t>* p = probs + bt * d.ws + (row - bt * d.H) * d.K;
    softmax_grad_row(p, gp + row * d.K, d.K, grad_logits + row * d.K);
  }
}

__device__ __forceinline__ void store_acc(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_acc(double* p, double v) { *p = v; }
template <typename T>
__device__ __forceinline__ void store_acc(T* p, acc_type<T> v) {
  *p = from_acc<T>(v);
}

// weight: the weights in the storage type, or the softmax probabilities (accumulation type).
template <typename scalar_t, typename w_t>
__global__ void __launch_bounds__(kThreads)
    dynamic_conv_bwd_input_kernel(const w_t* __restrict__ weight, const scalar_t* __restrict__ grad_out,
                                  scalar_t* __restrict__ grad_x, ConvDims d) {
  for (int64_t n = global_thread_id(); n < d.B * d.T * d.C; n += global_thread_count())
    conv_grad_x_element(weight, grad_out, grad_x, d, n);
}

// grad_weight, stored in the storage type, or in the accumulation type (gp, for the softmax gradient). Each group
// of G lanes owns one (b, t, h) (group id = (b*T + t)*H + h); the loops over groups and over k are warp-uniform so
// that every lane reaches the shuffles.
template <typename scalar_t, typename gw_t>
__global__ void __launch_bounds__(kThreads)
    dynamic_conv_bwd_weight_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ grad_out,
                                   gw_t* __restrict__ grad_weight, ConvDims d, int group) {
  using acc_t = acc_type<scalar_t>;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int r0 = lane % group;
  const int64_t groups_per_warp = kWarpSize / group;
  const int64_t n_groups = d.B * d.T * d.H;
  const int64_t warp = global_thread_id() / kWarpSize;
  const int64_t n_warps = global_thread_count() / kWarpSize;

  for (int64_t base = warp * groups_per_warp; base < n_groups; base += n_warps * groups_per_warp) {
    const int64_t bth = base + lane / group;
    const bool active = bth < n_groups;
    for (int64_t k = 0; k < d.K; ++k) {
      acc_t acc = active ? conv_grad_weight_partial(x, grad_out, d, bth, k, r0, group) : acc_t(0);
      acc = group_reduce_sum(acc, group);
      if (active && r0 == 0) store_acc(grad_weight + bth * d.K + k, acc);
    }
  }
}

// ------------------------------------------------------------------------------------------------ launchers

template <typename scalar_t>
cudaError_t launch_fwd(const DynamicConvParams& p, cudaStream_t stream) {
  const ConvDims d = make_dims(p);
  const unsigned blocks = grid_blocks(ceil_div(d.B * d.T * d.C, kThreads));
  dynamic_conv_fwd_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
      static_cast<const scalar_t*>(p.x), static_cast<const scalar_t*>(p.weight), static_cast<scalar_t*>(p.out), d);
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch_bwd(const DynamicConvParams& p, void* workspace, cudaStream_t stream) {
  using acc_t = acc_type<scalar_t>;
  const ConvDims d = make_dims(p);
  const unsigned blocks = grid_blocks(ceil_div(d.B * d.T * d.C, kThreads));
  const unsigned row_blocks = grid_blocks(ceil_div(d.B * d.T * d.H, kThreads));
  const int group = group_size_for(d.R);
  const unsigned w_blocks = grid_blocks(ceil_div(d.B * d.T * d.H, kThreads / group));
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* weight = static_cast<const scalar_t*>(p.weight);
  const auto* grad_out = static_cast<const scalar_t*>(p.grad_out);
  auto* grad_x = static_cast<scalar_t*>(p.grad_x);
  auto* grad_weight = static_cast<scalar_t*>(p.grad_weight);
  if (!d.softmax) {
    dynamic_conv_bwd_input_kernel<<<blocks, kThreads, 0, stream>>>(weight, grad_out, grad_x, d);
    dynamic_conv_bwd_weight_kernel<<<w_blocks, kThreads, 0, stream>>>(x, grad_out, grad_weight, d, group);
    return cudaGetLastError();
  }
  acc_t* probs = static_cast<acc_t*>(workspace);
  acc_t* gp = probs + d.B * d.T * d.H * d.K;
  softmax_rows_kernel<<<row_blocks, kThreads, 0, stream>>>(weight, probs, d);
  dynamic_conv_bwd_input_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const acc_t*>(probs), grad_out,
                                                                 grad_x, d);
  dynamic_conv_bwd_weight_kernel<<<w_blocks, kThreads, 0, stream>>>(x, grad_out, gp, d, group);
  softmax_grad_kernel<<<row_blocks, kThreads, 0, stream>>>(static_cast<const acc_t*>(probs),
                                                           static_cast<const acc_t*>(gp), grad_weight, d);
  return cudaGetLastError();
}

// One thread per column (b, c), n = b*C + c.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) dynamic_conv_step_kernel(const ConvStepArgs<scalar_t> a) {
  for (int64_t n = global_thread_id(); n < a.B * a.C; n += global_thread_count()) conv_step_column(a, n / a.C, n % a.C);
}

}  // namespace

// ------------------------------------------------------------------------------------------------ entry points

size_t dynamic_conv_bwd_workspace_bytes(const DynamicConvParams& p) {  // softmax: probabilities and gp
  if (!p.softmax || is_empty(p)) return 0;
  return align_up(static_cast<size_t>(2 * p.batch * p.seqlen * p.heads * p.kernel_size) * acc_bytes(p.dtype));
}

cudaError_t dynamic_conv_fwd_cuda(const DynamicConvParams& p, cudaStream_t stream) {
  if (is_empty(p)) return cudaSuccess;
  if (!valid_common(p) || p.out == nullptr) return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  DISPATCH_DTYPE(p.dtype, scalar_t, err = launch_fwd<scalar_t>(p, stream));
  return err;
}

cudaError_t dynamic_conv_bwd_cuda(const DynamicConvParams& p, void* workspace, cudaStream_t stream) {
  if (is_empty(p)) return cudaSuccess;
  if (!valid_common(p) || p.grad_out == nullptr || p.grad_x == nullptr || p.grad_weight == nullptr ||
      (p.softmax && workspace == nullptr))
    return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  DISPATCH_DTYPE(p.dtype, scalar_t, err = launch_bwd<scalar_t>(p, workspace, stream));
  return err;
}

}  // namespace talk_hf

namespace talk_hf {

cudaError_t dynamic_conv_step_cuda(const ConvStepParams& p, cudaStream_t stream) {
  using namespace cuda_detail;
  if (p.batch == 0 || p.seqlen == 0 || p.channels == 0) return cudaSuccess;
  if (!valid_dtype(p.dtype) || p.heads <= 0 || p.channels % p.heads != 0 || p.kernel_size < 1 || p.x == nullptr ||
      p.weight == nullptr || (p.kernel_size > 1 && (p.state == nullptr || p.new_state == nullptr)) ||
      p.out == nullptr)
    return cudaErrorInvalidValue;
  const unsigned blocks = grid_blocks(ceil_div(p.batch * p.channels, kThreads));
  DISPATCH_DTYPE(p.dtype, scalar_t,
                 dynamic_conv_step_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(ConvStepArgs<scalar_t>{
                     static_cast<const scalar_t*>(p.x), static_cast<const scalar_t*>(p.weight),
                     static_cast<const scalar_t*>(p.state), static_cast<scalar_t*>(p.out),
                     static_cast<scalar_t*>(p.new_state), p.batch, p.seqlen, p.channels, p.heads, p.kernel_size,
                     p.softmax, p.weight_broadcast ? 0 : p.heads * p.kernel_size}));
  return cudaGetLastError();
}

}  // namespace talk_hf
