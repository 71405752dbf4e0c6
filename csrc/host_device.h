// TALK_HD marks small math helpers shared by the CPU kernels (plain C++) and the CUDA kernels (nvcc); max64 / min64
// are two of them (int64 index arithmetic). TALK_UNROLL asks nvcc to unroll the loop that follows (device code only;
// host compilers warn about the pragma).
#pragma once

#if defined(__CUDACC__)
#define TALK_HD __host__ __device__ __forceinline__
#else
#define TALK_HD inline
#endif

// TALK_BLOCK marks block and warp programs: functions of a `Block` / `Warp` object whose barrier is device code on
// the GPU and a fiber switch in the CPU emulator (tests/ops/cuda_tile_emulator.cpp).
#if defined(__CUDACC__)
#define TALK_BLOCK __device__ __forceinline__
#else
#define TALK_BLOCK inline
#endif

#if defined(__CUDA_ARCH__)
#define TALK_UNROLL _Pragma("unroll")
#else
#define TALK_UNROLL
#endif

#include <stdint.h>

namespace talk_hf {

TALK_HD int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
TALK_HD int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

}  // namespace talk_hf
