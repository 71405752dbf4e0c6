// CUDA kernels of causal random-feature attention with a decay gate. The kernel bodies are the block programs of
// csrc/cuda/rfa_blocks.h (algorithm, layouts and the checkpoint convention are described there), run here with
// CudaBlock; the tests also run them on the CPU (tests/ops/cuda_tile_emulator.cpp). This is the simple, correct
// version: speed work (a chunked tensor-core form) is tracked by the performance issue.
#include "common.cuh"
#include "rfa_blocks.h"
#include "../talk_hf_kernels.h"

namespace talk_hf {
namespace {

using namespace cuda_detail;
using rfa_blocks::RfaArgs;
using rfa_blocks::RfaDims;

inline RfaDims make_dims(const RfaParams& p) {
  return {p.batch, p.seqlen, p.heads, p.features, p.head_dim, p.head_dim + 1, p.chunk, p.num_chunks};
}

// The block programs' Block on the GPU: thread index, __syncthreads, and a block-wide sum (warp shuffles, then
// one value per warp in `scratch`, kThreads / kWarpSize accumulators of shared memory); every thread gets the sum.
template <typename acc_t>
struct CudaBlock {
  acc_t* scratch;
  __device__ int64_t tid() const { return threadIdx.x; }
  __device__ int64_t size() const { return blockDim.x; }
  __device__ void sync() const { __syncthreads(); }
  __device__ acc_t reduce_sum(acc_t v) const {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    v = warp_reduce_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    acc_t total = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / kWarpSize); ++w) total += scratch[w];
    return total;
  }
};

template <typename acc_t>
__global__ void __launch_bounds__(kThreads) rfa_fwd_kernel(const RfaArgs<acc_t> a) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* smem = reinterpret_cast<acc_t*>(smem_raw);
  CudaBlock<acc_t> blk{smem + rfa_blocks::rfa_shared_elems(a.d)};
  rfa_blocks::rfa_fwd_block(blk, a, blockIdx.x, gridDim.x, smem);
}

template <typename acc_t>
__global__ void __launch_bounds__(kThreads) rfa_bwd_kernel(const RfaArgs<acc_t> a) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* smem = reinterpret_cast<acc_t*>(smem_raw);
  CudaBlock<acc_t> blk{smem + rfa_blocks::rfa_shared_elems(a.d)};
  rfa_blocks::rfa_bwd_block(blk, a, blockIdx.x, gridDim.x, smem);
}

template <typename acc_t>
RfaArgs<acc_t> make_args(const RfaParams& p, void* workspace) {
  RfaArgs<acc_t> a{};
  a.q = static_cast<const acc_t*>(p.q);
  a.k = static_cast<const acc_t*>(p.k);
  a.v = static_cast<const acc_t*>(p.v);
  a.decay = static_cast<const acc_t*>(p.decay);
  a.init = static_cast<const acc_t*>(p.initial_state);
  a.eps = static_cast<acc_t>(p.eps);
  a.out = static_cast<acc_t*>(p.out);
  a.state = static_cast<acc_t*>(p.state);
  a.checkpoints = static_cast<acc_t*>(p.checkpoints);
  a.grad_out = static_cast<const acc_t*>(p.grad_out);
  a.grad_final = static_cast<const acc_t*>(p.grad_state);
  a.grad_q = static_cast<acc_t*>(p.grad_q);
  a.grad_k = static_cast<acc_t*>(p.grad_k);
  a.grad_v = static_cast<acc_t*>(p.grad_v);
  a.grad_decay = static_cast<acc_t*>(p.grad_decay);
  a.grad_init = static_cast<acc_t*>(p.grad_initial_state);
  a.workspace = static_cast<acc_t*>(workspace);
  a.d = make_dims(p);
  return a;
}

inline bool valid(const RfaParams& p) {
  return (p.dtype == DType::kFloat32 || p.dtype == DType::kFloat64) && p.batch >= 0 && p.seqlen >= 0 &&
         p.heads > 0 && p.features > 0 && p.head_dim > 0 && p.chunk >= 0 &&
         p.num_chunks == rfa_num_chunks(p.seqlen, p.chunk);
}

template <typename acc_t>
size_t shared_bytes(const RfaDims& d) {
  return (rfa_blocks::rfa_shared_elems(d) + kThreads / kWarpSize) * sizeof(acc_t);
}

constexpr size_t kMaxSharedBytes = 48 * 1024;  // the default dynamic shared memory limit

// One launch of `kernel` over the (b, h) pairs, or an error when its shared memory exceeds the default limit.
template <typename acc_t>
cudaError_t launch(void (*kernel)(const RfaArgs<acc_t>), const RfaArgs<acc_t>& a, cudaStream_t stream) {
  if (shared_bytes<acc_t>(a.d) > kMaxSharedBytes) return cudaErrorInvalidValue;
  kernel<<<grid_blocks(a.d.B * a.d.H), kThreads, shared_bytes<acc_t>(a.d), stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

size_t rfa_causal_bwd_workspace_bytes(const RfaParams& p) {
  const size_t acc = p.dtype == DType::kFloat64 ? sizeof(double) : sizeof(float);
  return static_cast<size_t>(p.batch * p.heads) * static_cast<size_t>(p.chunk + 2) *
         static_cast<size_t>(p.features * (p.head_dim + 1)) * acc;
}

cudaError_t rfa_causal_fwd_cuda(const RfaParams& p, cudaStream_t stream) {
  if (!valid(p)) return cudaErrorInvalidValue;
  if (p.batch * p.heads == 0) return cudaGetLastError();
  if (p.dtype == DType::kFloat32) return launch(rfa_fwd_kernel<float>, make_args<float>(p, nullptr), stream);
  return launch(rfa_fwd_kernel<double>, make_args<double>(p, nullptr), stream);
}

cudaError_t rfa_causal_bwd_cuda(const RfaParams& p, void* workspace, cudaStream_t stream) {
  if (!valid(p) || p.chunk < 1 || p.seqlen == 0) return cudaErrorInvalidValue;  // T = 0: handled by the caller
  if (p.batch * p.heads == 0) return cudaGetLastError();
  if (p.dtype == DType::kFloat32) return launch(rfa_bwd_kernel<float>, make_args<float>(p, workspace), stream);
  return launch(rfa_bwd_kernel<double>, make_args<double>(p, workspace), stream);
}

}  // namespace talk_hf
