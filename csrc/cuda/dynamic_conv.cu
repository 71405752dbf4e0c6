// CUDA kernels of the dynamic / lightweight convolution. Specification: talk_hf/dynamic_conv.py
// (`dynamic_conv_ref`); layouts and the per-element programs in csrc/dynamic_conv_math.h.
//
// Forward:  one thread per (b, t, c) (conv_fwd_element: a gather over the in-range taps).
// Backward: grad_x: one thread per (b, s, c) (conv_grad_x_element: a gather, no atomics).
//           grad_weight: a block per (b, 64 steps, h, up to 32 taps), the grad_out and x rows of 32 channels at a
//           time staged in shared memory, 8 taps of one step per thread (dynamic_conv_tiles.h; deterministic).
// Decoding step: one thread per column (b, c) runs dynamic_conv_step.h's column program.
// softmax=true (weight holds logits, softmax_row.h) or DropConnect (dropconnect.h): the forward writes each row's
// taps (probabilities, times DropConnect's factors) to a workspace (a lane group per row) and convolves with them;
// the step normalises the row of its (b, t, h) in registers (each thread reads the K logits of its row, a broadcast
// within the head; a few tokens per call; no DropConnect); the backward writes the taps and the raw tap gradients gp
// to a workspace (2 x B*T*H*K accumulators), runs grad_x on the taps, then a lane group per row turns gp into the
// weights' gradient: p * (gp - sum p gp) with the probabilities read from the taps, or, with DropConnect, its
// factors applied to gp and the probabilities worked out again from the logits (the taps hold p times factors).
#include "common.cuh"
#include "dynamic_conv_tiles.h"
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
  d.ws = p.weight_broadcast ? 0 : p.heads * p.kernel_size;
  return d;
}

inline bool is_empty(const DynamicConvParams& p) { return p.batch == 0 || p.seqlen == 0 || p.channels == 0; }

inline bool valid_common(const DynamicConvParams& p) {
  return valid_dtype(p.dtype) && p.batch > 0 && p.seqlen > 0 && p.channels > 0 && p.heads > 0 &&
         p.channels % p.heads == 0 && p.kernel_size >= 1 && p.x != nullptr && p.weight != nullptr &&
         p.weight_dropout >= 0.0 && p.weight_dropout <= 1.0 && (p.weight_dropout == 0.0 || p.seed != nullptr);
}

// The kernels form the taps themselves (a workspace of them) when they normalise or drop; else the weights are the
// taps.
inline bool own_taps(const DynamicConvParams& p) { return p.softmax || p.weight_dropout > 0.0; }

// DropConnect as the kernels receive it: the seed stays on the device (no host sync; CUDA-graph friendly) and is
// read by every thread.
struct DropConnectArgs {
  const int64_t* seed;  // nullptr when p = 0
  double p;
};

template <typename acc_t>
__device__ __forceinline__ DropConnect<acc_t> load_dropconnect(const DropConnectArgs& a) {
  return make_dropconnect<acc_t>(a.p, a.p > 0.0 ? *a.seed : 0);
}

// ------------------------------------------------------------------------------------------------ kernels

// weight: the weights in the storage type, or the softmax probabilities (accumulation type).
template <typename scalar_t, typename w_t>
__global__ void __launch_bounds__(kThreads)
    dynamic_conv_fwd_kernel(const scalar_t* __restrict__ x, const w_t* __restrict__ weight,
                            scalar_t* __restrict__ out, ConvDims d) {
  for (int64_t n = global_thread_id(); n < d.B * d.T * d.C; n += global_thread_count())
    conv_fwd_element(x, weight, out, d, n);
}

// A group of `group` lanes per softmax row (softmax_group_lanes: about 4 taps per lane, so a warp works on several
// rows at once; lanes take the taps j, j + group, ...: coalesced reads of each row, every logit read once per pass).
// The loop over rows is warp-uniform so every lane reaches the shuffles; a lane past the last row works on the last
// row and writes nothing.
struct RowGroup {
  int64_t row;  // this lane's row
  int lane;     // lane within the group
  bool active;  // row < rows
};

__device__ __forceinline__ int64_t row_groups_per_warp(int group) { return kWarpSize / group; }

__device__ __forceinline__ RowGroup row_group(int64_t first_row, int64_t rows, int group) {
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int64_t row = first_row + lane / group;
  return {row < rows ? row : rows - 1, lane % group, row < rows};
}

// The softmax stats of a row of K logits whose taps a group of `group` lanes shares (all-reduced: every lane of the
// group gets them; every lane of the warp must call it).
template <typename T>
__device__ __forceinline__ SoftmaxStats<acc_type<T>> group_softmax_stats(const T* row, int64_t K, int lane,
                                                                         int group) {
  using acc_t = acc_type<T>;
  const acc_t m = group_allreduce_max(softmax_lane_max(row, K, lane, group), group);
  return {m, acc_t(1) / group_allreduce_sum(softmax_lane_sum(row, K, m, lane, group), group)};
}

// taps[row*K + k] = the row's weights, or their softmax probabilities, times DropConnect's factors: the B*T*H rows of
// the weights, or the H rows of a LightConv kernel (ws = 0); taps is laid out as the weights.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    taps_rows_kernel(const scalar_t* __restrict__ weight, acc_type<scalar_t>* __restrict__ taps, ConvDims d,
                     int group, bool softmax, DropConnectArgs dca) {
  using acc_t = acc_type<scalar_t>;
  const DropConnect<acc_t> dc = load_dropconnect<acc_t>(dca);
  const int64_t rows = weight_rows(d), per_warp = row_groups_per_warp(group);
  const int64_t warp = global_thread_id() / kWarpSize, n_warps = global_thread_count() / kWarpSize;
  for (int64_t first = warp * per_warp; first < rows; first += n_warps * per_warp) {
    const RowGroup g = row_group(first, rows, group);
    const scalar_t* row = weight + g.row * d.K;
    // softmax is uniform over the grid: every lane reaches the shuffles
    const SoftmaxStats<acc_t> s = softmax ? group_softmax_stats(row, d.K, g.lane, group) : SoftmaxStats<acc_t>{0, 1};
    if (g.active) taps_lane_write(row, d.K, softmax, s, dc, g.row * d.K, taps + g.row * d.K, g.lane, group);
  }
}

// grad_weight rows (B*T*H of them) from the taps' gradient gp, a group of lanes per row as above. Without DropConnect
// (so with a softmax) the taps are the probabilities: p * (gp - sum p gp). With it, its factors scale gp, and a
// softmax's probabilities are worked out again from the logits (dynamic_conv_math.h's lane programs).
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    weight_grad_rows_kernel(const scalar_t* __restrict__ weight, const acc_type<scalar_t>* __restrict__ taps,
                            const acc_type<scalar_t>* __restrict__ gp, scalar_t* __restrict__ grad_weight, ConvDims d,
                            int group, bool softmax, DropConnectArgs dca) {
  using acc_t = acc_type<scalar_t>;
  const DropConnect<acc_t> dc = load_dropconnect<acc_t>(dca);
  const int64_t rows = d.B * d.T * d.H, per_warp = row_groups_per_warp(group);
  const int64_t warp = global_thread_id() / kWarpSize, n_warps = global_thread_count() / kWarpSize;
  for (int64_t first_row = warp * per_warp; first_row < rows; first_row += n_warps * per_warp) {
    const RowGroup g = row_group(first_row, rows, group);
    const int64_t bt = g.row / d.H, first = bt * d.ws + (g.row - bt * d.H) * d.K;  // the row's tap 0 in weight
    const acc_t* gpr = gp + g.row * d.K;
    scalar_t* out = grad_weight + g.row * d.K;
    if (!dc.on) {
      const acc_t* p = taps + first;
      const acc_t dot = group_allreduce_sum(softmax_grad_lane_dot(p, gpr, d.K, g.lane, group), group);
      if (g.active) softmax_grad_lane_write(p, gpr, d.K, dot, out, g.lane, group);
      continue;
    }
    const scalar_t* row = weight + first;
    const SoftmaxStats<acc_t> s = softmax ? group_softmax_stats(row, d.K, g.lane, group) : SoftmaxStats<acc_t>{0, 1};
    const acc_t dot =
        softmax ? group_allreduce_sum(dropconnect_grad_lane_dot(row, s, gpr, dc, first, d.K, g.lane, group), group)
                : acc_t(0);
    if (g.active) dropconnect_grad_lane_write(row, softmax, s, gpr, dc, first, d.K, dot, out, g.lane, group);
  }
}

// Blocks for a group of `group` lanes per row.
inline unsigned row_group_blocks(int64_t rows, int group) {
  return grid_blocks(cdiv(rows, kThreads / group));
}

// weight: the weights in the storage type, or the softmax probabilities (accumulation type).
template <typename scalar_t, typename w_t>
__global__ void __launch_bounds__(kThreads)
    dynamic_conv_bwd_input_kernel(const w_t* __restrict__ weight, const scalar_t* __restrict__ grad_out,
                                  scalar_t* __restrict__ grad_x, ConvDims d) {
  for (int64_t n = global_thread_id(); n < d.B * d.T * d.C; n += global_thread_count())
    conv_grad_x_element(weight, grad_out, grad_x, d, n);
}

// grad_weight, stored in the storage type, or in the accumulation type (gp, for the softmax gradient): the block
// program of dynamic_conv_tiles.h over a grid-stride loop of blocks (conv_tiles::wg_threads(d) threads each).
template <typename scalar_t, typename gw_t>
__global__ void __launch_bounds__(kThreads)
    dynamic_conv_bwd_weight_kernel(const scalar_t* __restrict__ x, const scalar_t* __restrict__ grad_out,
                                   gw_t* __restrict__ grad_weight, ConvDims d) {
  extern __shared__ __align__(16) unsigned char conv_shared[];
  auto* smem = reinterpret_cast<acc_type<scalar_t>*>(conv_shared);
  for (int64_t block = blockIdx.x; block < conv_tiles::wg_num_blocks(d); block += gridDim.x)
    conv_tiles::wg_block_program(CudaThreads{}, x, grad_out, grad_weight, d, block, smem);
}

// Launches the weight-gradient kernel (at most 42 KiB of shared memory: fp64 with 32 taps per block).
template <typename scalar_t, typename gw_t>
void launch_weight_grad(const scalar_t* x, const scalar_t* grad_out, gw_t* grad_weight, const ConvDims& d,
                        cudaStream_t stream) {
  const size_t shared = static_cast<size_t>(conv_tiles::wg_shared_elems(d)) * sizeof(acc_type<scalar_t>);
  dynamic_conv_bwd_weight_kernel<<<grid_blocks(conv_tiles::wg_num_blocks(d)),
                                   static_cast<unsigned>(conv_tiles::wg_threads(d)), shared, stream>>>(
      x, grad_out, grad_weight, d);
}

// ------------------------------------------------------------------------------------------------ launchers

template <typename scalar_t>
cudaError_t launch_fwd(const DynamicConvParams& p, void* workspace, cudaStream_t stream) {
  using acc_t = acc_type<scalar_t>;
  const ConvDims d = make_dims(p);
  const unsigned blocks = grid_blocks(cdiv(d.B * d.T * d.C, kThreads));
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* weight = static_cast<const scalar_t*>(p.weight);
  auto* out = static_cast<scalar_t*>(p.out);
  if (!own_taps(p)) {
    dynamic_conv_fwd_kernel<<<blocks, kThreads, 0, stream>>>(x, weight, out, d);
    return cudaGetLastError();
  }
  // Each row's taps once (a lane group per row), then the convolution with them: normalising in every output
  // thread took the K exponentials R times per row (R = 64 channels per head: 2.6x slower on an H100).
  acc_t* taps = static_cast<acc_t*>(workspace);
  const int group = softmax_group_lanes(d.K);
  taps_rows_kernel<<<row_group_blocks(weight_rows(d), group), kThreads, 0, stream>>>(
      weight, taps, d, group, p.softmax, DropConnectArgs{p.seed, p.weight_dropout});
  dynamic_conv_fwd_kernel<<<blocks, kThreads, 0, stream>>>(x, static_cast<const acc_t*>(taps), out, d);
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch_bwd(const DynamicConvParams& p, void* workspace, cudaStream_t stream) {
  using acc_t = acc_type<scalar_t>;
  const ConvDims d = make_dims(p);
  const unsigned blocks = grid_blocks(cdiv(d.B * d.T * d.C, kThreads));
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* weight = static_cast<const scalar_t*>(p.weight);
  const auto* grad_out = static_cast<const scalar_t*>(p.grad_out);
  auto* grad_x = static_cast<scalar_t*>(p.grad_x);
  auto* grad_weight = static_cast<scalar_t*>(p.grad_weight);
  if (!own_taps(p)) {
    dynamic_conv_bwd_input_kernel<<<blocks, kThreads, 0, stream>>>(weight, grad_out, grad_x, d);
    launch_weight_grad(x, grad_out, grad_weight, d, stream);
    return cudaGetLastError();
  }
  acc_t* taps = static_cast<acc_t*>(workspace);
  acc_t* gp = taps + d.B * d.T * d.H * d.K;
  const int k_group = softmax_group_lanes(d.K);
  const DropConnectArgs dca{p.seed, p.weight_dropout};
  taps_rows_kernel<<<row_group_blocks(weight_rows(d), k_group), kThreads, 0, stream>>>(weight, taps, d, k_group,
                                                                                       p.softmax, dca);
  dynamic_conv_bwd_input_kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const acc_t*>(taps), grad_out,
                                                                 grad_x, d);
  launch_weight_grad(x, grad_out, gp, d, stream);
  weight_grad_rows_kernel<<<row_group_blocks(d.B * d.T * d.H, k_group), kThreads, 0, stream>>>(
      weight, static_cast<const acc_t*>(taps), static_cast<const acc_t*>(gp), grad_weight, d, k_group, p.softmax,
      dca);
  return cudaGetLastError();
}

// One thread per column (b, c), n = b*C + c.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) dynamic_conv_step_kernel(const ConvStepArgs<scalar_t> a) {
  for (int64_t n = global_thread_id(); n < a.B * a.C; n += global_thread_count()) conv_step_column(a, n / a.C, n % a.C);
}

}  // namespace

// ------------------------------------------------------------------------------------------------ entry points

size_t dynamic_conv_bwd_workspace_bytes(const DynamicConvParams& p) {  // own taps: the taps and gp
  if (!own_taps(p) || is_empty(p)) return 0;
  return align_up(static_cast<size_t>(2 * p.batch * p.seqlen * p.heads * p.kernel_size) * acc_bytes(p.dtype));
}

size_t dynamic_conv_fwd_workspace_bytes(const DynamicConvParams& p) {  // own taps: the taps
  if (!own_taps(p) || is_empty(p)) return 0;
  return align_up(static_cast<size_t>(weight_rows(make_dims(p)) * p.kernel_size) * acc_bytes(p.dtype));
}

cudaError_t dynamic_conv_fwd_cuda(const DynamicConvParams& p, void* workspace, cudaStream_t stream) {
  if (is_empty(p)) return cudaSuccess;
  if (!valid_common(p) || p.out == nullptr || (own_taps(p) && workspace == nullptr)) return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  DISPATCH_DTYPE(p.dtype, scalar_t, err = launch_fwd<scalar_t>(p, workspace, stream));
  return err;
}

cudaError_t dynamic_conv_bwd_cuda(const DynamicConvParams& p, void* workspace, cudaStream_t stream) {
  if (is_empty(p)) return cudaSuccess;
  if (!valid_common(p) || p.grad_out == nullptr || p.grad_x == nullptr || p.grad_weight == nullptr ||
      (own_taps(p) && workspace == nullptr))
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
  const unsigned blocks = grid_blocks(cdiv(p.batch * p.channels, kThreads));
  DISPATCH_DTYPE(p.dtype, scalar_t,
                 dynamic_conv_step_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(ConvStepArgs<scalar_t>{
                     static_cast<const scalar_t*>(p.x), static_cast<const scalar_t*>(p.weight),
                     static_cast<const scalar_t*>(p.state), static_cast<scalar_t*>(p.out),
                     static_cast<scalar_t*>(p.new_state), p.batch, p.seqlen, p.channels, p.heads, p.kernel_size,
                     p.softmax, p.weight_broadcast ? 0 : p.heads * p.kernel_size}));
  return cudaGetLastError();
}

}  // namespace talk_hf
