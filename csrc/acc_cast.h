// Accumulation types and the conversions between storage and accumulation types, shared by the CUDA kernels and
// by host code that runs their block programs (tests/ops/cuda_tile_emulator.cpp). fp16/bf16 exist only under nvcc.
//   - acc_type<scalar_t>: double for fp64, float for fp32 / fp16 / bf16
//   - to_acc(v): storage -> accumulation type
//   - from_acc<scalar_t>(v): accumulation -> storage type, round to nearest even (as torch's .to(dtype))
//   - floor_acc(v), acc_exp(v): floor and exp in the accumulation type (float or double overloads)
#pragma once
#include <math.h>

#include "host_device.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace talk_hf {

template <typename scalar_t>
struct AccTypeOf {
  using type = float;  // fp32, fp16, bf16
};
template <>
struct AccTypeOf<double> {
  using type = double;
};
template <typename scalar_t>
using acc_type = typename AccTypeOf<scalar_t>::type;

TALK_HD float to_acc(float v) { return v; }
TALK_HD double to_acc(double v) { return v; }

TALK_HD float floor_acc(float v) { return floorf(v); }
TALK_HD double floor_acc(double v) { return floor(v); }
TALK_HD float acc_exp(float v) { return expf(v); }
TALK_HD double acc_exp(double v) { return exp(v); }

template <typename scalar_t>
struct StoreAs {
  static TALK_HD scalar_t cast(acc_type<scalar_t> v) { return v; }  // float, double
};

#if defined(__CUDACC__)
TALK_HD float to_acc(__half v) { return __half2float(v); }
TALK_HD float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <>
struct StoreAs<__half> {
  static TALK_HD __half cast(float v) { return __float2half_rn(v); }
};
template <>
struct StoreAs<__nv_bfloat16> {
  static TALK_HD __nv_bfloat16 cast(float v) { return __float2bfloat16_rn(v); }
};
#endif

template <typename scalar_t>
TALK_HD scalar_t from_acc(acc_type<scalar_t> v) {
  return StoreAs<scalar_t>::cast(v);
}

}  // namespace talk_hf
