// TALK_HD marks small math helpers shared by the CPU kernels (plain C++) and the CUDA kernels (nvcc); max64, min64
// and cdiv (ceiling division) are three of them (int64 index arithmetic). TALK_UNROLL asks nvcc to unroll the loop
// that follows (device code only; host compilers warn about the pragma).
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
TALK_HD constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }  // a >= 0, b > 0

// a * b rounded to its type on its own: nvcc contracts `a * b - c` into one fma (the product unrounded), so a
// difference that must cancel exactly (x - x for a one-tap softmax row) takes its product from here on both sides.
TALK_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TALK_HD double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// Lanes of a warp given to one item of n parts (a softmax row of K taps, a head of R channels): the smallest power of
// two that leaves at most `per_lane` parts to a lane, at most 32; a warp then works on 32 / lanes items at once.
TALK_HD int lane_group(int64_t n, int64_t per_lane) {
  int g = 1;
  while (g < 32 && g * per_lane < n) g *= 2;
  return g;
}

}  // namespace talk_hf
