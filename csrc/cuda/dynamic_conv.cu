// CUDA kernels of the dynamic / lightweight convolution. Specification: talk_hf/dynamic_conv.py
// (`dynamic_conv_ref`).
//
// Layouts (all contiguous, batch-first, channels-last):
//   x, out, grad_out, grad_x   (B, T, C)     at [(b*T + t)*C + c]
//   weight, grad_weight        (B, T, H, K)  at [((b*T + t)*H + h)*K + k];   head of channel c: h = c / R, R = C / H
//   out[b, t, c] = sum_k weight[b, t, h, k] * x[b, t + k - P, c]   (x = 0 outside [0, T))
//
// Forward:  one thread per (b, t, c), loop over the in-range taps (a gather).
// Backward: grad_x: one thread per (b, s, c), loop over the taps k whose output position t = s - k + P is in range
//           (a gather, no atomics).
//           grad_weight: one group of G lanes per (b, t, h) (G = power of two >= min(R, 32)); for each k the lanes
//           stride over the head's R channels and a group shuffle reduction gives the sum (deterministic).
// Decoding step: one thread per column (b, c) runs dynamic_conv_step.h's column program.
// softmax=true (weight holds logits, softmax_row.h): the forward and the step normalise the row of their (b, t, h)
// in registers (each thread reads the K logits of its row, a broadcast within the head); the backward writes the
// probabilities and the raw tap gradients gp to a workspace (2 x B*T*H*K accumulators), runs grad_x on the
// probabilities, then one thread per row turns gp into the logits' gradient p * (gp - sum p gp).
#include "common.cuh"
#include "../dynamic_conv_step.h"
#include "../softmax_row.h"
#include "../talk_hf_kernels.h"

namespace talk_hf {
namespace {

using namespace cuda_detail;

struct ConvDims {
  int64_t B, T, C, H, R, K;
  int64_t P;  // padding_left, clamped to [-(T + K), T + K] (same result: beyond that every tap is out of range)
  bool softmax;
};

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
  return d;
}

inline bool is_empty(const DynamicConvParams& p) { return p.batch == 0 || p.seqlen == 0 || p.channels == 0; }

inline bool valid_common(const DynamicConvParams& p) {
  return valid_dtype(p.dtype) && p.batch > 0 && p.seqlen > 0 && p.channels > 0 && p.heads > 0 &&
         p.channels % p.heads == 0 && p.kernel_size >= 1 && p.x != nullptr && p.weight != nullptr;
}

__device__ __forceinline__ int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// ------------------------------------------------------------------------------------------------ kernels

// out[b, t, c] = sum over k in [max(0, P - t), min(K, T + P - t)) (exactly the taps with 0 <= t + k - P < T)
// of weight[b, t, h, k] * x[b, t + k - P, c]. One thread per (b, t, c), n = (b*T + t)*C + c.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    dynamic_conv_fwd_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ weight,
                            scalar_t* __restrict__ out, ConvDims d) {
  using acc_t = acc_type<scalar_t>;
  const int64_t total = d.B * d.T * d.C;
  for (int64_t n = global_thread_id(); n < total; n += global_thread_count()) {
    const int64_t bt = n / d.C;
    const int64_t c = n - bt * d.C;
    const int64_t b = bt / d.T;
    const int64_t t = bt - b * d.T;
    const scalar_t* wrow = weight + (bt * d.H + c / d.R) * d.K;
    const scalar_t* xcol = x + b * d.T * d.C + c;
    const int64_t k_begin = max64(0, d.P - t);
    const int64_t k_end = min64(d.K, d.T + d.P - t);
    const SoftmaxStats<acc_t> sm = d.softmax ? softmax_stats(wrow, d.K) : SoftmaxStats<acc_t>{acc_t(0), acc_t(1)};
    acc_t acc = acc_t(0);
    for (int64_t k = k_begin; k < k_end; ++k) {
      const acc_t w = d.softmax ? softmax_prob(sm, to_acc(wrow[k])) : to_acc(wrow[k]);
      acc += w * to_acc(xcol[(t + k - d.P) * d.C]);
    }
    out[n] = from_acc<scalar_t>(acc);
  }
}

// probs[row*K + k] = softmax of the row's logits (row = (b*T + t)*H + h), one thread per row.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    softmax_rows_kernel(const scalar_t* __restrict__ logits, acc_type<scalar_t>* __restrict__ probs, ConvDims d) {
  for (int64_t row = global_thread_id(); row < d.B * d.T * d.H; row += global_thread_count()) {
    const scalar_t* l = logits + row * d.K;
    const SoftmaxStats<acc_type<scalar_t>> sm = softmax_stats(l, d.K);
    for (int64_t k = 0; k < d.K; ++k) probs[row * d.K + k] = softmax_prob(sm, to_acc(l[k]));
  }
}

// grad_logits[row*K + k] = p_k * (gp_k - sum_j p_j gp_j), one thread per row.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    softmax_grad_kernel(const acc_type<scalar_t>* __restrict__ probs, const acc_type<scalar_t>* __restrict__ gp,
                        scalar_t* __restrict__ grad_logits, ConvDims d) {
  using acc_t = acc_type<scalar_t>;
  for (int64_t row = global_thread_id(); row < d.B * d.T * d.H; row += global_thread_count()) {
    const acc_t* p = probs + row * d.K;
    const acc_t* g = gp + row * d.K;
    acc_t dot = acc_t(0);
    for (int64_t k = 0; k < d.K; ++k) dot += p[k] * g[k];
    for (int64_t k = 0; k < d.K; ++k) grad_logits[row * d.K + k] = from_acc<scalar_t>(p[k] * (g[k] - dot));
  }
}

__device__ __forceinline__ void store_acc(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_acc(double* p, double v) { *p = v; }
template <typename T>
__device__ __forceinline__ void store_acc(T* p, acc_type<T> v) {
  *p = from_acc<T>(v);
}

// grad_x[b, s, c] = sum_k weight[b, t, h, k] * grad_out[b, t, c] with t = s - k + P, over
// k in [max(0, s + P - T + 1), min(K, s + P + 1)) (exactly the taps with 0 <= t < T); weight in the storage type,
// or the softmax probabilities (accumulation type).
// One thread per (b, s, c), n = (b*T + s)*C + c.
template <typename scalar_t, typename w_t>
__global__ void __launch_bounds__(kThreads)
    dynamic_conv_bwd_input_kernel(const w_t* __restrict__ weight, const scalar_t* __restrict__ grad_out,
                                  scalar_t* __restrict__ grad_x, ConvDims d) {
  using acc_t = acc_type<scalar_t>;
  const int64_t total = d.B * d.T * d.C;
  for (int64_t n = global_thread_id(); n < total; n += global_thread_count()) {
    const int64_t bs = n / d.C;
    const int64_t c = n - bs * d.C;
    const int64_t b = bs / d.T;
    const int64_t s = bs - b * d.T;
    const int64_t h = c / d.R;
    const int64_t k_begin = max64(0, s + d.P - d.T + 1);
    const int64_t k_end = min64(d.K, s + d.P + 1);
    acc_t acc = acc_t(0);
    for (int64_t k = k_begin; k < k_end; ++k) {
      const int64_t bt = b * d.T + (s - k + d.P);
      acc += to_acc(weight[(bt * d.H + h) * d.K + k]) * to_acc(grad_out[bt * d.C + c]);
    }
    grad_x[n] = from_acc<scalar_t>(acc);
  }
}

// grad_weight[b, t, h, k] = sum over the head's channels c of grad_out[b, t, c] * x[b, t + k - P, c]
// (0 when t + k - P is outside [0, T)), stored in the storage type, or in the accumulation type (gp, for the
// softmax gradient). Each group of G lanes owns one (b, t, h) (group id = (b*T + t)*H + h); the loops over groups
// and over k are warp-uniform so that every lane reaches the shuffles.
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
    const int64_t bt = bth / d.H;
    const int64_t h = bth - bt * d.H;
    const int64_t b = bt / d.T;
    const int64_t t = bt - b * d.T;
    const scalar_t* gcol = grad_out + bt * d.C + h * d.R;  // channel r of head h at gcol[r]
    for (int64_t k = 0; k < d.K; ++k) {
      const int64_t s = t + k - d.P;
      acc_t acc = acc_t(0);
      if (active && s >= 0 && s < d.T) {
        const scalar_t* xrow = x + (b * d.T + s) * d.C + h * d.R;
        for (int64_t r = r0; r < d.R; r += group) acc += to_acc(gcol[r]) * to_acc(xrow[r]);
      }
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
                     p.softmax}));
  return cudaGetLastError();
}

}  // namespace talk_hf
