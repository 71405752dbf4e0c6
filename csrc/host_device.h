// TALK_HD marks small math helpers shared by the CPU kernels (plain C++) and the CUDA kernels (nvcc).
#pragma once

#if defined(__CUDACC__)
#define TALK_HD __host__ __device__ __forceinline__
#else
#define TALK_HD inline
#endif
