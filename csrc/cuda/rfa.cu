// CUDA kernels of causal random-feature attention with a decay gate. Specification: talk_hf/rfa.py
// (`rfa_causal_ref`); the algorithm and the checkpoint convention are those of csrc/cpu/rfa_cpu.cpp:
//   P_t = decay[t-1] * P_{t-1} + k_t [v_t, 1]^T,  out_t = (q_t^T P_t)[:D] / max((q_t^T P_t)[D], eps),
//   final = decay[T-1] * P_{T-1},  checkpoints[n] = P_{n*chunk - 1} (the initial state for n = 0).
//
// Layouts: q, k (B, T, H, F); v, out (B, T, H, D); decay (B, T, H); states (B, H, F, E), E = D + 1, row-major
// (f, e). fp32 or fp64 throughout (the Python wrapper casts activations to the state dtype first).
//
// One thread block per (b, h), stepping through time; the (F, E) state lives in global memory (the final-state
// output in the forward, a workspace in the backward) and stays in L2. Within a step the block's threads
// split the state's entries (updates), its columns (q^T P, G^T k) or its rows (P g, G v); reductions are fixed-order,
// so results are deterministic. This is the simple, correct version: speed work (chunked tensor-core form) is
// tracked by the performance issue.
//
// Backward, per (b, h), chunks in reverse: recompute the chunk's states from its checkpoint into the workspace,
// then for t from the chunk end down: g = d out / d (q^T P_t); G += q_t g^T (G = dL/dP_t);
// dq_t = P_t g; dk_t = G [v_t, 1]; dv_t = (G^T k_t)[:D]; ddecay[t-1] = <G, P_{t-1}>; G *= decay[t-1].
// Workspace: (B*H) x ((chunk + 1) states + 1 adjoint) x F x E accumulators.
#include "common.cuh"
#include "../rfa_math.h"
#include "../talk_hf_kernels.h"

namespace talk_hf {
namespace {

using namespace cuda_detail;

struct RfaDims {
  int64_t B, T, H, F, D, E, chunk, N;
};

inline RfaDims make_dims(const RfaParams& p) {
  return {p.batch, p.seqlen, p.heads, p.features, p.head_dim, p.head_dim + 1, p.chunk, p.num_chunks};
}

// Offset of row (b, t, h) of a (B, T, H, width) tensor.
__device__ __forceinline__ int64_t bth(const RfaDims& d, int64_t b, int64_t t, int64_t h, int64_t width) {
  return ((b * d.T + t) * d.H + h) * width;
}

// Sum of v over the block (every thread calls it; the result is returned to every thread). `scratch` holds
// one value per warp.
template <typename T>
__device__ T block_reduce_sum(T v, T* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  v = warp_reduce_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < static_cast<int>(blockDim.x / kWarpSize); ++w) total += scratch[w];
  return total;
}

// Stage q_t / k_t (F), [v_t, 1] (E) of one step into shared memory. Caller synchronises.
template <typename acc_t>
__device__ void load_step(const acc_t* q, const acc_t* k, const acc_t* v, const RfaDims& d, int64_t b, int64_t t,
                          int64_t h, acc_t* sq, acc_t* sk, acc_t* svv) {
  for (int64_t f = threadIdx.x; f < d.F; f += blockDim.x) {
    if (sq) sq[f] = q[bth(d, b, t, h, d.F) + f];
    sk[f] = k[bth(d, b, t, h, d.F) + f];
  }
  for (int64_t e = threadIdx.x; e < d.E; e += blockDim.x) svv[e] = e < d.D ? v[bth(d, b, t, h, d.D) + e] : acc_t(1);
}

// dst = scale * src + k vv^T over the block's entries (dst may alias src: each entry is read, then written, by
// one thread).
template <typename acc_t>
__device__ void advance_state(const acc_t* src, acc_t scale, const acc_t* sk, const acc_t* svv, acc_t* dst,
                              const RfaDims& d) {
  for (int64_t i = threadIdx.x; i < d.F * d.E; i += blockDim.x) dst[i] = scale * src[i] + sk[i / d.E] * svv[i % d.E];
}

// num[e] = sum_f q[f] P[f, e], one column per thread.
template <typename acc_t>
__device__ void read_state(const acc_t* P, const acc_t* sq, acc_t* num, const RfaDims& d) {
  for (int64_t e = threadIdx.x; e < d.E; e += blockDim.x) {
    acc_t sum = 0;
    for (int64_t f = 0; f < d.F; ++f) sum += sq[f] * P[f * d.E + e];
    num[e] = sum;
  }
}

template <typename acc_t>
__device__ __forceinline__ acc_t decay_at(const acc_t* decay, const RfaDims& d, int64_t b, int64_t t, int64_t h) {
  return decay ? decay[(b * d.T + t) * d.H + h] : acc_t(1);
}

template <typename acc_t>
__global__ void __launch_bounds__(kThreads)
    rfa_fwd_kernel(const acc_t* __restrict__ q, const acc_t* __restrict__ k, const acc_t* __restrict__ v,
                   const acc_t* __restrict__ decay, const acc_t* __restrict__ init, acc_t eps, acc_t* __restrict__ out,
                   acc_t* __restrict__ state, acc_t* __restrict__ checkpoints, RfaDims d) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* sq = reinterpret_cast<acc_t*>(smem_raw);
  acc_t* sk = sq + d.F;
  acc_t* svv = sk + d.F;
  acc_t* num = svv + d.E;
  const int64_t S = d.F * d.E;
  for (int64_t bh = blockIdx.x; bh < d.B * d.H; bh += gridDim.x) {
    const int64_t b = bh / d.H, h = bh % d.H;
    acc_t* P = state + bh * S;
    for (int64_t i = threadIdx.x; i < S; i += blockDim.x) P[i] = init ? init[bh * S + i] : acc_t(0);
    acc_t scale = 1;
    for (int64_t t = 0; t < d.T; ++t) {
      if (d.chunk > 0 && t % d.chunk == 0) {  // same thread-to-entry mapping as advance_state: no barrier needed between them
        acc_t* ck = checkpoints + (bh * d.N + t / d.chunk) * S;
        for (int64_t i = threadIdx.x; i < S; i += blockDim.x) ck[i] = P[i];
      }
      load_step(q, k, v, d, b, t, h, sq, sk, svv);
      __syncthreads();
      advance_state(P, scale, sk, svv, P, d);
      __syncthreads();
      read_state(P, sq, num, d);
      __syncthreads();
      const acc_t den = num[d.D] > eps ? num[d.D] : eps;
      for (int64_t e = threadIdx.x; e < d.D; e += blockDim.x) out[bth(d, b, t, h, d.D) + e] = num[e] / den;
      scale = decay_at(decay, d, b, t, h);
      __syncthreads();  // shared vectors are reloaded next step
    }
    for (int64_t i = threadIdx.x; i < S; i += blockDim.x) P[i] *= scale;
    __syncthreads();
  }
}

template <typename acc_t>
__global__ void __launch_bounds__(kThreads)
    rfa_bwd_kernel(const acc_t* __restrict__ go, const acc_t* __restrict__ gfinal, const acc_t* __restrict__ q,
                   const acc_t* __restrict__ k, const acc_t* __restrict__ v, const acc_t* __restrict__ decay,
                   const acc_t* __restrict__ checkpoints, acc_t eps, acc_t* __restrict__ gq, acc_t* __restrict__ gk,
                   acc_t* __restrict__ gv, acc_t* __restrict__ gdecay, acc_t* __restrict__ ginit,
                   acc_t* __restrict__ workspace, RfaDims d) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* sq = reinterpret_cast<acc_t*>(smem_raw);
  acc_t* sk = sq + d.F;
  acc_t* svv = sk + d.F;
  acc_t* num = svv + d.E;
  acc_t* g = num + d.E;
  acc_t* scratch = g + d.E;  // kThreads / kWarpSize entries
  const int64_t S = d.F * d.E;
  for (int64_t bh = blockIdx.x; bh < d.B * d.H; bh += gridDim.x) {
    const int64_t b = bh / d.H, h = bh % d.H;
    acc_t* states = workspace + bh * (d.chunk + 2) * S;  // states[0] = P_{t0-1}, states[i + 1] = P_{t0+i}
    acc_t* G = states + (d.chunk + 1) * S;
    for (int64_t i = threadIdx.x; i < S; i += blockDim.x) G[i] = 0;
    for (int64_t n = d.N - 1; n >= 0; --n) {
      const int64_t t0 = n * d.chunk, t1 = min(d.T, t0 + d.chunk);
      const acc_t* ck = checkpoints + (bh * d.N + n) * S;
      for (int64_t i = threadIdx.x; i < S; i += blockDim.x) states[i] = ck[i];
      for (int64_t t = t0; t < t1; ++t) {
        load_step<acc_t>(nullptr, k, v, d, b, t, h, nullptr, sk, svv);
        __syncthreads();
        advance_state(states + (t - t0) * S, t > 0 ? decay_at(decay, d, b, t - 1, h) : acc_t(1), sk, svv,
                      states + (t - t0 + 1) * S, d);
        __syncthreads();
      }
      for (int64_t t = t1 - 1; t >= t0; --t) {
        const acc_t* P = states + (t - t0 + 1) * S;
        const acc_t* prev = P - S;
        if (t == d.T - 1) {  // final = decay[T-1] * P_{T-1}
          acc_t dot = 0;
          const acc_t scale = decay_at(decay, d, b, t, h);
          for (int64_t i = threadIdx.x; i < S; i += blockDim.x) {
            const acc_t gf = gfinal ? gfinal[bh * S + i] : acc_t(0);
            dot += gf * P[i];
            G[i] = scale * gf;
          }
          dot = block_reduce_sum(dot, scratch);
          if (gdecay && threadIdx.x == 0) gdecay[(b * d.T + t) * d.H + h] = dot;
        }
        load_step(q, k, v, d, b, t, h, sq, sk, svv);
        __syncthreads();
        read_state(P, sq, num, d);
        __syncthreads();
        if (threadIdx.x == 0) rfa_normalise_backward(num, go + bth(d, b, t, h, d.D), eps, g, d.D);
        __syncthreads();
        for (int64_t i = threadIdx.x; i < S; i += blockDim.x) G[i] += sq[i / d.E] * g[i % d.E];
        __syncthreads();
        for (int64_t f = threadIdx.x; f < d.F; f += blockDim.x) {
          acc_t dq = 0, dk = 0;
          for (int64_t e = 0; e < d.E; ++e) {
            dq += P[f * d.E + e] * g[e];
            dk += G[f * d.E + e] * svv[e];
          }
          gq[bth(d, b, t, h, d.F) + f] = dq;
          gk[bth(d, b, t, h, d.F) + f] = dk;
        }
        for (int64_t e = threadIdx.x; e < d.D; e += blockDim.x) {
          acc_t dv = 0;
          for (int64_t f = 0; f < d.F; ++f) dv += G[f * d.E + e] * sk[f];
          gv[bth(d, b, t, h, d.D) + e] = dv;
        }
        if (t > 0) {
          acc_t dot = 0;
          for (int64_t i = threadIdx.x; i < S; i += blockDim.x) dot += G[i] * prev[i];
          dot = block_reduce_sum(dot, scratch);  // synchronises: G is no longer read after this
          if (gdecay && threadIdx.x == 0) gdecay[(b * d.T + t - 1) * d.H + h] = dot;
          const acc_t scale = decay_at(decay, d, b, t - 1, h);
          for (int64_t i = threadIdx.x; i < S; i += blockDim.x) G[i] *= scale;
        }
        __syncthreads();
      }
    }
    if (ginit)
      for (int64_t i = threadIdx.x; i < S; i += blockDim.x) ginit[bh * S + i] = G[i];
    __syncthreads();
  }
}

inline bool valid(const RfaParams& p) {
  return (p.dtype == DType::kFloat32 || p.dtype == DType::kFloat64) && p.batch >= 0 && p.seqlen >= 0 &&
         p.heads > 0 && p.features > 0 && p.head_dim > 0 && p.chunk >= 0 &&
         p.num_chunks == rfa_num_chunks(p.seqlen, p.chunk);
}

template <typename acc_t>
size_t shared_bytes(const RfaDims& d) {
  return (2 * d.F + 3 * d.E + kThreads / kWarpSize) * sizeof(acc_t);
}

constexpr size_t kMaxSharedBytes = 48 * 1024;  // the default dynamic shared memory limit

}  // namespace

size_t rfa_causal_bwd_workspace_bytes(const RfaParams& p) {
  const size_t acc = p.dtype == DType::kFloat64 ? sizeof(double) : sizeof(float);
  return static_cast<size_t>(p.batch * p.heads) * static_cast<size_t>(p.chunk + 2) *
         static_cast<size_t>(p.features * (p.head_dim + 1)) * acc;
}

cudaError_t rfa_causal_fwd_cuda(const RfaParams& p, cudaStream_t stream) {
  if (!valid(p)) return cudaErrorInvalidValue;
  const RfaDims d = make_dims(p);
  if (d.B * d.H == 0) return cudaGetLastError();
  const unsigned grid = grid_blocks(d.B * d.H);
  if (p.dtype == DType::kFloat32) {
    if (shared_bytes<float>(d) > kMaxSharedBytes) return cudaErrorInvalidValue;
    rfa_fwd_kernel<float><<<grid, kThreads, shared_bytes<float>(d), stream>>>(
        static_cast<const float*>(p.q), static_cast<const float*>(p.k), static_cast<const float*>(p.v),
        static_cast<const float*>(p.decay), static_cast<const float*>(p.initial_state), static_cast<float>(p.eps),
        static_cast<float*>(p.out), static_cast<float*>(p.state), static_cast<float*>(p.checkpoints), d);
  } else {
    if (shared_bytes<double>(d) > kMaxSharedBytes) return cudaErrorInvalidValue;
    rfa_fwd_kernel<double><<<grid, kThreads, shared_bytes<double>(d), stream>>>(
        static_cast<const double*>(p.q), static_cast<const double*>(p.k), static_cast<const double*>(p.v),
        static_cast<const double*>(p.decay), static_cast<const double*>(p.initial_state), p.eps,
        static_cast<double*>(p.out), static_cast<double*>(p.state), static_cast<double*>(p.checkpoints), d);
  }
  return cudaGetLastError();
}

cudaError_t rfa_causal_bwd_cuda(const RfaParams& p, void* workspace, cudaStream_t stream) {
  if (!valid(p) || p.chunk < 1 || p.seqlen == 0) return cudaErrorInvalidValue;  // T = 0: handled by the caller
  const RfaDims d = make_dims(p);
  if (d.B * d.H == 0) return cudaGetLastError();
  const unsigned grid = grid_blocks(d.B * d.H);
  if (p.dtype == DType::kFloat32) {
    if (shared_bytes<float>(d) > kMaxSharedBytes) return cudaErrorInvalidValue;
    rfa_bwd_kernel<float><<<grid, kThreads, shared_bytes<float>(d), stream>>>(
        static_cast<const float*>(p.grad_out), static_cast<const float*>(p.grad_state),
        static_cast<const float*>(p.q), static_cast<const float*>(p.k), static_cast<const float*>(p.v),
        static_cast<const float*>(p.decay), static_cast<const float*>(p.checkpoints), static_cast<float>(p.eps),
        static_cast<float*>(p.grad_q), static_cast<float*>(p.grad_k), static_cast<float*>(p.grad_v),
        static_cast<float*>(p.grad_decay), static_cast<float*>(p.grad_initial_state), static_cast<float*>(workspace),
        d);
  } else {
    if (shared_bytes<double>(d) > kMaxSharedBytes) return cudaErrorInvalidValue;
    rfa_bwd_kernel<double><<<grid, kThreads, shared_bytes<double>(d), stream>>>(
        static_cast<const double*>(p.grad_out), static_cast<const double*>(p.grad_state),
        static_cast<const double*>(p.q), static_cast<const double*>(p.k), static_cast<const double*>(p.v),
        static_cast<const double*>(p.decay), static_cast<const double*>(p.checkpoints), p.eps,
        static_cast<double*>(p.grad_q), static_cast<double*>(p.grad_k), static_cast<double*>(p.grad_v),
        static_cast<double*>(p.grad_decay), static_cast<double*>(p.grad_initial_state),
        static_cast<double*>(workspace), d);
  }
  return cudaGetLastError();
}

}  // namespace talk_hf
