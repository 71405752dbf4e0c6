// CUDA kernels of the TaLK convolution. Specification: talk_hf/talk_conv.py (`talk_conv_ref`).
//
// The kernels run the block programs of talk_conv_tiles.h (which also says what each phase does and why it is
// exact for any offsets); the tests run the same programs on the CPU (tests/ops/test_cuda_tile_programs.py).
// Forward: one fused kernel, block = (b, tile of steps, 32 channels) x 8 warps: x read once plus an L2-resident
//          halo, the output written once, prefix sums in shared memory (fp32 for fp16/bf16/fp32, fp64 for fp64),
//          each (step, head)'s window rows worked out once per block.
// Backward: reach (per (b, h), atomicMax of per-thread maxima into a 16-byte-per-(b, h) workspace), offset gradients
//          (per (b, t, h), a deterministic group reduction of g * x over the head's channels), grad x (tile-local
//          scatter and suffix sums in shared memory, one warp per (b, tile, 32 channels), window ends worked out
//          once per (step, head), no atomics).
// Decoding step: one thread per column (b, c) runs talk_conv_step.h's column program (the CPU kernel runs it too).
// No host synchronisation anywhere: every launch shape comes from the sizes alone (CUDA-graph friendly).
#include "common.cuh"
#include "talk_conv_tiles.h"
#include "../talk_conv_step.h"
#include "../talk_hf_kernels.h"

namespace talk_hf {
namespace {

using namespace cuda_detail;
using tiles::TalkArgs;

using tiles::kFwdWarps;
using tiles::kGradXWarps;

inline bool is_empty(const TalkConvParams& p) { return p.batch == 0 || p.seqlen == 0 || p.channels == 0; }

inline bool valid_common(const TalkConvParams& p) {
  return valid_dtype(p.dtype) && p.batch > 0 && p.seqlen > 0 && p.channels > 0 && p.heads > 0 &&
         p.channels % p.heads == 0 && p.max_left >= 0 && p.max_right >= 0 && p.x != nullptr &&
         p.offset_left != nullptr && (!p.has_right || p.offset_right != nullptr);
}

template <typename scalar_t>
TalkArgs<scalar_t> make_args(const TalkConvParams& p) {
  TalkArgs<scalar_t> a{};
  a.x = static_cast<const scalar_t*>(p.x);
  a.offset_left = static_cast<const scalar_t*>(p.offset_left);
  a.offset_right = static_cast<const scalar_t*>(p.offset_right);
  a.out = static_cast<scalar_t*>(p.out);
  a.grad_out = static_cast<const scalar_t*>(p.grad_out);
  a.grad_x = static_cast<scalar_t*>(p.grad_x);
  a.grad_offset_left = static_cast<scalar_t*>(p.grad_offset_left);
  a.grad_offset_right = static_cast<scalar_t*>(p.grad_offset_right);
  a.B = p.batch;
  a.T = p.seqlen;
  a.C = p.channels;
  a.H = p.heads;
  a.R = p.channels / p.heads;
  a.max_left = p.max_left;
  a.max_right = p.max_right;
  a.has_right = p.has_right;
  return a;
}

// ------------------------------------------------------------------------------------------------ kernels

// Dynamic shared memory, aligned for double.
__device__ __forceinline__ void* shared_buffer() {
  extern __shared__ __align__(16) unsigned char talk_shared[];
  return talk_shared;
}

template <typename scalar_t>
__global__ void __launch_bounds__(kFwdWarps * kWarpSize) talk_fwd_kernel(const TalkArgs<scalar_t> a) {
  using acc_t = acc_type<scalar_t>;
  acc_t* table = static_cast<acc_t*>(shared_buffer());
  acc_t* carry = table + a.rows * tiles::kLanes;
  auto* windows = reinterpret_cast<tiles::WindowRows<acc_t>*>(
      static_cast<unsigned char*>(shared_buffer()) + tiles::fwd_accumulators_bytes(a.rows, a.warps, sizeof(acc_t)));
  const int w = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  for (int64_t block = blockIdx.x; block < tiles::num_tiles(a); block += gridDim.x) {
    const tiles::FwdBlock k = tiles::fwd_block(a, block);
    tiles::fwd_scan(a, k, table, w, lane);
    tiles::fwd_windows(a, k, windows, w, lane);
    __syncthreads();
    tiles::fwd_carry(a, k, table, carry, w, lane);
    __syncthreads();
    tiles::fwd_add_carry(a, k, table, carry, w, lane);
    __syncthreads();
    tiles::fwd_gather(a, k, table, windows, w, lane);
    __syncthreads();  // the next block's scan overwrites the table and the windows
  }
}

// reach[b, h] = max over t of the rows before / after t read by the window of (b, t, h). One thread per (b, chunk
// of kReachSteps steps, h), h fastest (coalesced offset reads), one atomicMax pair per thread.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) talk_reach_kernel(const TalkArgs<scalar_t> a) {
  const int64_t chunks = cdiv(a.T, tiles::kReachSteps);
  const int64_t total = a.B * chunks * a.H;
  for (int64_t n = global_thread_id(); n < total; n += global_thread_count()) {
    const int64_t h = n % a.H, chunk = n / a.H % chunks, b = n / (a.H * chunks);
    const int64_t t0 = chunk * tiles::kReachSteps;
    int64_t before, after;
    tiles::reach_of_steps(a, b, h, t0, min64(a.T, t0 + tiles::kReachSteps), &before, &after);
    unsigned long long* r = a.reach + (b * a.H + h) * 2;
    atomicMax(r, static_cast<unsigned long long>(before));
    atomicMax(r + 1, static_cast<unsigned long long>(after));
  }
}

// Offset gradients: one group of `group` lanes (tiles::offset_grad_group: about 4 channels per lane) per (b, t, h)
// (group id = (b*T + t)*H + h), its lanes striding over the head's channels, then a shuffle reduction (fixed order).
// The loop bound is warp-uniform so every lane reaches the shuffles.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) talk_offset_grad_kernel(const TalkArgs<scalar_t> a, int group) {
  using acc_t = acc_type<scalar_t>;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int r0 = lane % group;
  const int64_t groups_per_warp = kWarpSize / group;
  const int64_t n_groups = a.B * a.T * a.H;
  const int64_t warp = global_thread_id() / kWarpSize;
  const int64_t n_warps = global_thread_count() / kWarpSize;
  for (int64_t first = warp * groups_per_warp; first < n_groups; first += n_warps * groups_per_warp) {
    const int64_t bth = first + lane / group;
    acc_t left = acc_t(0), right = acc_t(0);
    if (bth < n_groups) {
      const int64_t bt = bth / a.H, b = bt / a.T;
      tiles::offset_grad_partial(a, b, bt - b * a.T, bth - bt * a.H, r0, group, &left, &right);
    }
    left = group_reduce_sum(left, group);
    right = group_reduce_sum(right, group);
    if (bth < n_groups && r0 == 0) tiles::write_offset_grads(a, bth, left, right);
  }
}

// grad x: one warp per unit (b, tile, 32 channels), kGradXWarps units per block, each warp with its own shared
// memory (tiles::gx_warp_bytes: its q buffer and its window ends); the loop over units is warp-uniform.
template <typename scalar_t>
__global__ void __launch_bounds__(kGradXWarps * kWarpSize) talk_grad_x_kernel(const TalkArgs<scalar_t> a) {
  using acc_t = acc_type<scalar_t>;
  const int w = threadIdx.x / kWarpSize;
  unsigned char* mine = static_cast<unsigned char*>(shared_buffer()) + w * tiles::gx_warp_bytes(a, sizeof(acc_t));
  acc_t* q = reinterpret_cast<acc_t*>(mine);
  auto* ends = reinterpret_cast<tiles::EndTargets<acc_t>*>(mine + tiles::gx_q_bytes(a, sizeof(acc_t)));
  const int64_t units = tiles::num_tiles(a);
  for (int64_t unit = static_cast<int64_t>(blockIdx.x) * kGradXWarps + w; unit < units;
       unit += static_cast<int64_t>(gridDim.x) * kGradXWarps) {
    tiles::gx_warp(CudaWarp{}, a, tiles::tile_at(a, unit), q, ends);
  }
}

// One thread per column (b, c), n = b*C + c (consecutive threads, consecutive channels: coalesced rows).
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads) talk_step_kernel(const TalkStepArgs<scalar_t> a) {
  for (int64_t n = global_thread_id(); n < a.B * a.C; n += global_thread_count()) talk_step_column(a, n / a.C, n % a.C);
}

// ------------------------------------------------------------------------------------------------ launchers

template <typename scalar_t>
cudaError_t launch_fwd(const TalkConvParams& p, cudaStream_t stream) {
  using acc_t = acc_type<scalar_t>;
  TalkArgs<scalar_t> a = make_args<scalar_t>(p);
  tiles::set_fwd_shape(a, sizeof(acc_t));
  const size_t shared = static_cast<size_t>(tiles::fwd_shared_bytes(a, sizeof(acc_t)));  // <= 48 KiB
  talk_fwd_kernel<scalar_t><<<grid_blocks(tiles::num_tiles(a)), kFwdWarps * kWarpSize, shared, stream>>>(a);
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch_bwd(const TalkConvParams& p, void* workspace, cudaStream_t stream) {
  using acc_t = acc_type<scalar_t>;
  TalkArgs<scalar_t> a = make_args<scalar_t>(p);
  a.reach = static_cast<unsigned long long*>(workspace);
  cudaError_t err = cudaMemsetAsync(a.reach, 0, talk_conv_bwd_workspace_bytes(p), stream);
  if (err != cudaSuccess) return err;
  const int64_t reach_threads = a.B * cdiv(a.T, tiles::kReachSteps) * a.H;
  talk_reach_kernel<scalar_t><<<grid_blocks(cdiv(reach_threads, kThreads)), kThreads, 0, stream>>>(a);

  const int group = tiles::offset_grad_group(a.R);
  const unsigned group_blocks = grid_blocks(cdiv(a.B * a.T * a.H, kThreads / group));
  talk_offset_grad_kernel<scalar_t><<<group_blocks, kThreads, 0, stream>>>(a, group);

  tiles::set_gx_shape(a, sizeof(acc_t));
  const size_t shared = static_cast<size_t>(tiles::gx_shared_bytes(a, sizeof(acc_t)));  // 36 / 38 KiB
  const unsigned gx_blocks = grid_blocks(cdiv(tiles::num_tiles(a), kGradXWarps));
  talk_grad_x_kernel<scalar_t><<<gx_blocks, kGradXWarps * kWarpSize, shared, stream>>>(a);
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch_step(const TalkStepParams& p, void* workspace, cudaStream_t stream) {
  using acc_t = acc_type<scalar_t>;
  const TalkStepArgs<scalar_t> a{static_cast<const scalar_t*>(p.x), static_cast<const scalar_t*>(p.offset_left),
                                 static_cast<const acc_t*>(p.state), static_cast<scalar_t*>(p.out),
                                 static_cast<acc_t*>(p.new_state), static_cast<acc_t*>(workspace),
                                 p.batch, p.seqlen, p.channels, p.heads, p.max_left};
  talk_step_kernel<scalar_t><<<grid_blocks(cdiv(p.batch * p.channels, kThreads)), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

// ------------------------------------------------------------------------------------------------ entry points

size_t talk_conv_step_workspace_bytes(const TalkStepParams& p) {  // ext: (B, max_left + 2 + T, C) accumulators
  return align_up(static_cast<size_t>(p.batch * (p.max_left + 2 + p.seqlen) * p.channels) * acc_bytes(p.dtype));
}

cudaError_t talk_conv_step_cuda(const TalkStepParams& p, void* workspace, cudaStream_t stream) {
  if (p.batch == 0 || p.seqlen == 0 || p.channels == 0) return cudaSuccess;
  if (!valid_dtype(p.dtype) || p.heads <= 0 || p.channels % p.heads != 0 || p.max_left < 0 || p.x == nullptr ||
      p.offset_left == nullptr || p.state == nullptr || p.out == nullptr || p.new_state == nullptr ||
      workspace == nullptr)
    return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  DISPATCH_DTYPE(p.dtype, scalar_t, err = launch_step<scalar_t>(p, workspace, stream));
  return err;
}

size_t talk_conv_fwd_workspace_bytes(const TalkConvParams&) { return 0; }

size_t talk_conv_bwd_workspace_bytes(const TalkConvParams& p) {
  if (is_empty(p)) return 0;
  return align_up(static_cast<size_t>(p.batch * p.heads * 2) * sizeof(unsigned long long));  // reach
}

cudaError_t talk_conv_fwd_cuda(const TalkConvParams& p, void*, cudaStream_t stream) {
  if (is_empty(p)) return cudaSuccess;
  if (!valid_common(p) || p.out == nullptr) return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  DISPATCH_DTYPE(p.dtype, scalar_t, err = launch_fwd<scalar_t>(p, stream));
  return err;
}

cudaError_t talk_conv_bwd_cuda(const TalkConvParams& p, void* workspace, cudaStream_t stream) {
  if (is_empty(p)) return cudaSuccess;
  if (!valid_common(p) || p.grad_out == nullptr || p.grad_x == nullptr || p.grad_offset_left == nullptr ||
      (p.has_right && p.grad_offset_right == nullptr) || workspace == nullptr)
    return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  DISPATCH_DTYPE(p.dtype, scalar_t, err = launch_bwd<scalar_t>(p, workspace, stream));
  return err;
}

}  // namespace talk_hf
