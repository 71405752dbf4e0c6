// Small device helpers shared by the CUDA kernels of talk_hf (no torch headers).
//   - acc_type, to_acc, from_acc: accumulation types and conversions (acc_cast.h, shared with host code)
//   - group_reduce_sum, group_allreduce_sum / _max: over aligned power-of-two groups of lanes inside a warp
//   - CudaThreads, CudaWarp: the Block / Warp that the block and warp programs run on
//   - align_up, grid sizing and grid-stride indices in int64
//   - DISPATCH_DTYPE(dtype, scalar_t, ...): runs `...` with `scalar_t` bound to the storage type of `dtype`
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../acc_cast.h"
#include "../talk_hf_kernels.h"

namespace talk_hf {
namespace cuda_detail {

constexpr int kThreads = 256;                   // block size of every kernel (a multiple of the warp size)
constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kMaxBlocks = int64_t(1) << 30;  // below the gridDim.x limit (2^31 - 1); kernels grid-stride
constexpr size_t kWorkspaceAlign = 256;         // alignment of every workspace sub-buffer

// ------------------------------------------------------------------------------------------------ types

// Bytes of one accumulator element for a dtype (host side, for workspace sizes).
inline size_t acc_bytes(DType dtype) { return dtype == DType::kFloat64 ? sizeof(double) : sizeof(float); }

inline bool valid_dtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

// ------------------------------------------------------------------------------------------------ reductions

// Sum of v over each aligned group of `group` consecutive lanes (group a power of two, 1..32); the result is
// valid in the first lane of each group. Every lane of the warp must call it (full mask).
template <typename T>
__device__ __forceinline__ T group_reduce_sum(T v, int group) {
  for (int offset = group / 2; offset > 0; offset /= 2) v += __shfl_down_sync(kFullMask, v, offset, group);
  return v;
}

// Sum / max of v over each aligned group of `group` lanes (a power of two, 1..32), in every lane of the group.
template <typename T>
__device__ __forceinline__ T group_allreduce_sum(T v, int group) {
  for (int mask = group / 2; mask > 0; mask /= 2) v += __shfl_xor_sync(kFullMask, v, mask, group);
  return v;
}

template <typename T>
__device__ __forceinline__ T group_allreduce_max(T v, int group) {
  for (int mask = group / 2; mask > 0; mask /= 2) {
    const T other = __shfl_xor_sync(kFullMask, v, mask, group);
    v = other > v ? other : v;
  }
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_reduce_sum(T v) {
  return group_reduce_sum(v, kWarpSize);
}

// ------------------------------------------------------------------------------------------------ programs

// The `Block` of the block programs on the GPU: thread index, block size, __syncthreads (the CPU emulator gives
// the same interface on fibers).
struct CudaThreads {
  __device__ int64_t tid() const { return threadIdx.x; }
  __device__ int64_t size() const { return blockDim.x; }
  __device__ void sync() const { __syncthreads(); }
};

// The `Warp` of the warp programs on the GPU: the lane, and __syncwarp as the barrier.
struct CudaWarp {
  __device__ int64_t tid() const { return threadIdx.x % kWarpSize; }
  __device__ void sync() const { __syncwarp(); }
};

// ------------------------------------------------------------------------------------------------ indexing

inline size_t align_up(size_t bytes) { return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

// 1-D grid for `blocks_needed` blocks, capped (kernels use grid-stride loops, so the cap only limits occupancy).
inline unsigned grid_blocks(int64_t blocks_needed) {
  const int64_t b = blocks_needed < 1 ? 1 : (blocks_needed > kMaxBlocks ? kMaxBlocks : blocks_needed);
  return static_cast<unsigned>(b);
}

__device__ __forceinline__ int64_t global_thread_id() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t global_thread_count() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace cuda_detail
}  // namespace talk_hf

// ------------------------------------------------------------------------------------------------ dispatch

#define TALK_HF_DISPATCH_CASE(ENUM, TYPE, SCALAR, ...) \
  case ::talk_hf::DType::ENUM: {                       \
    using SCALAR = TYPE;                               \
    __VA_ARGS__;                                       \
  } break;

// Runs the statement `...` with SCALAR bound to float / double / __half / __nv_bfloat16; its accumulation type
// is talk_hf::cuda_detail::acc_type<SCALAR>. An unknown dtype runs nothing (check valid_dtype first).
#define DISPATCH_DTYPE(DTYPE, SCALAR, ...)                                  \
  switch (DTYPE) {                                                          \
    TALK_HF_DISPATCH_CASE(kFloat32, float, SCALAR, __VA_ARGS__)             \
    TALK_HF_DISPATCH_CASE(kFloat64, double, SCALAR, __VA_ARGS__)            \
    TALK_HF_DISPATCH_CASE(kFloat16, __half, SCALAR, __VA_ARGS__)            \
    TALK_HF_DISPATCH_CASE(kBFloat16, __nv_bfloat16, SCALAR, __VA_ARGS__)    \
    default:                                                                \
      break;                                                                \
  }
