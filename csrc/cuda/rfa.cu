// CUDA kernels of causal random-feature attention with a decay gate. The kernel bodies are block programs, run here
// with CudaBlock; the tests also run them on the CPU (tests/ops/cuda_tile_emulator.cpp). For T > 1 the chunked
// programs of csrc/cuda/rfa_chunked_blocks.h run (chunks of `chunk` steps, 64 without checkpoints; products over
// shared-memory tiles) when their shared memory fits the device; otherwise, and for decoding steps (T = 1), the
// per-step programs of csrc/cuda/rfa_blocks.h (algorithm, layouts and the checkpoint convention are described
// there; both write the same checkpoints). The chunked programs' products are SIMT loops, or with the op's `tf32`
// (fp32, sm_80 and newer) tensor-core mma.sync steps (csrc/cuda/tile_products.h).
#include <type_traits>

#include "common.cuh"
#include "rfa_blocks.h"
#include "rfa_chunked_blocks.h"
#include "../talk_hf_kernels.h"

namespace talk_hf {
namespace {

using namespace cuda_detail;
using rfa_blocks::RfaArgs;
using rfa_blocks::RfaDims;

inline RfaDims make_dims(const RfaParams& p) {
  return {p.batch, p.seqlen, p.heads, p.features, p.head_dim, p.head_dim + 1, p.chunk, p.num_chunks};
}

// CudaThreads and a block-wide sum (warp shuffles, then one value per warp in `scratch`, blockDim.x / kWarpSize
// accumulators of shared memory); every thread gets the sum. mma_tf32: the warp's tensor-core step of
// tile_products.h (d += A B, 16 x 8 x 8, TF32 operands from load(lane, a, b), fp32 accumulation).
template <typename acc_t>
struct CudaBlock : CudaThreads {
  acc_t* scratch;
  template <typename Load>
  __device__ void mma_tf32(float (&d)[4], Load load) const {
#if __CUDA_ARCH__ >= 800
    float a[4], b[2];
    load(static_cast<int>(threadIdx.x % kWarpSize), a, b);
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(__float_as_uint(a[0])), "r"(__float_as_uint(a[1])), "r"(__float_as_uint(a[2])),
          "r"(__float_as_uint(a[3])), "r"(__float_as_uint(b[0])), "r"(__float_as_uint(b[1])));
#else
    __trap();  // the launcher picks tensor-core kernels on sm_80 and newer only
#endif
  }
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
  CudaBlock<acc_t> blk{{}, smem + rfa_blocks::rfa_shared_elems(a.d)};
  rfa_blocks::rfa_fwd_block(blk, a, blockIdx.x, gridDim.x, smem);
}

template <typename acc_t>
__global__ void __launch_bounds__(kThreads) rfa_bwd_kernel(const RfaArgs<acc_t> a) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* smem = reinterpret_cast<acc_t*>(smem_raw);
  CudaBlock<acc_t> blk{{}, smem + rfa_blocks::rfa_shared_elems(a.d)};
  rfa_blocks::rfa_bwd_block(blk, a, blockIdx.x, gridDim.x, smem);
}

// Two forward blocks per SM (at most 102 registers a thread; their shared memory fits twice at F = D = L = 64): the
// 160 (b, h) blocks of the Table 6 shape run in one wave on 132 SMs. The backward's shared memory allows one.
// Tile: rfa_chunked::MicroTile<acc_t> (SIMT) or rfa_chunked::WarpTile (tensor cores, fp32).
template <typename acc_t, typename Tile>
__global__ void __launch_bounds__(rfa_chunked::kMaxThreads, 2) rfa_chunked_fwd_kernel(const RfaArgs<acc_t> a) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* smem = reinterpret_cast<acc_t*>(smem_raw);
  CudaBlock<acc_t> blk{{}, smem + rfa_chunked::shared_elems<Tile>(a.d, false)};
  rfa_chunked::rfa_chunked_fwd_block<Tile>(blk, a, blockIdx.x, gridDim.x, smem);
}

template <typename acc_t, typename Tile>
__global__ void __launch_bounds__(rfa_chunked::kMaxThreads) rfa_chunked_bwd_kernel(const RfaArgs<acc_t> a) {
  extern __shared__ unsigned char smem_raw[];
  acc_t* smem = reinterpret_cast<acc_t*>(smem_raw);
  CudaBlock<acc_t> blk{{}, smem + rfa_chunked::shared_elems<Tile>(a.d, true)};
  rfa_chunked::rfa_chunked_bwd_block<Tile>(blk, a, blockIdx.x, gridDim.x, smem);
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

// One launch of a per-step `kernel` over the (b, h) pairs, or an error when its shared memory exceeds the default
// limit.
template <typename acc_t>
cudaError_t launch(void (*kernel)(const RfaArgs<acc_t>), const RfaArgs<acc_t>& a, cudaStream_t stream) {
  if (shared_bytes<acc_t>(a.d) > kMaxSharedBytes) return cudaErrorInvalidValue;
  kernel<<<grid_blocks(a.d.B * a.d.H), kThreads, shared_bytes<acc_t>(a.d), stream>>>(a);
  return cudaGetLastError();
}

// Dynamic shared memory a block may use on the current device when it opts in; 0 when the query fails (the per-step
// kernels then run, and their launch reports the error).
inline size_t device_shared_limit() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return 0;
  return static_cast<size_t>(bytes);
}

// Tensor-core products: asked for (p.tf32), fp32, and a device of compute capability 8.0 or newer.
inline bool use_tensor_cores(const RfaParams& p) {
  int device = 0, major = 0;
  return p.tf32 && p.dtype == DType::kFloat32 && cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 8;
}

// The chunked programs run for T > 1 when their shared memory fits the device; the per-step ones otherwise.
inline bool use_chunked(const RfaParams& p, bool backward) {
  if (p.seqlen <= 1) return false;
  const int64_t bytes = rfa_chunked::shared_bytes(make_dims(p), static_cast<int64_t>(acc_bytes(p.dtype)), backward,
                                                  use_tensor_cores(p));
  return static_cast<size_t>(bytes) <= device_shared_limit();
}

// One launch of the chunked forward or backward kernel of tile kind `Tile` over the (b, h) pairs, opting in to more
// than 48 KiB of shared memory if needed.
template <typename Tile, typename acc_t>
cudaError_t launch_chunked(const RfaArgs<acc_t>& a, bool backward, cudaStream_t stream) {
  void (*kernel)(const RfaArgs<acc_t>) =
      backward ? rfa_chunked_bwd_kernel<acc_t, Tile> : rfa_chunked_fwd_kernel<acc_t, Tile>;
  const int64_t bytes = rfa_chunked::shared_bytes<Tile>(a.d, sizeof(acc_t), backward);
  if (static_cast<size_t>(bytes) > kMaxSharedBytes) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (err != cudaSuccess) return err;
  }
  const unsigned threads = static_cast<unsigned>(rfa_chunked::chunked_threads(a.d));
  kernel<<<grid_blocks(a.d.B * a.d.H), threads, static_cast<size_t>(bytes), stream>>>(a);
  return cudaGetLastError();
}

// The chunked launch in the tile kind the call asks for: tensor cores when use_tensor_cores(p), SIMT otherwise.
template <typename acc_t>
cudaError_t launch_chunked(const RfaParams& p, const RfaArgs<acc_t>& a, bool backward, cudaStream_t stream) {
  if constexpr (std::is_same_v<acc_t, float>)
    if (use_tensor_cores(p)) return launch_chunked<rfa_chunked::WarpTile>(a, backward, stream);
  return launch_chunked<rfa_chunked::MicroTile<acc_t>>(a, backward, stream);
}

template <typename acc_t>
cudaError_t forward(const RfaParams& p, cudaStream_t stream) {
  const RfaArgs<acc_t> a = make_args<acc_t>(p, nullptr);
  if (use_chunked(p, false)) return launch_chunked(p, a, false, stream);
  return launch(rfa_fwd_kernel<acc_t>, a, stream);
}

template <typename acc_t>
cudaError_t backward(const RfaParams& p, void* workspace, cudaStream_t stream) {
  const RfaArgs<acc_t> a = make_args<acc_t>(p, workspace);
  if (use_chunked(p, true)) return launch_chunked(p, a, true, stream);
  return launch(rfa_bwd_kernel<acc_t>, a, stream);
}

}  // namespace

// The chunked backward keeps its states in shared memory; the per-step one recomputes a chunk's states into the
// workspace.
size_t rfa_causal_bwd_workspace_bytes(const RfaParams& p) {
  if (use_chunked(p, true)) return 0;
  return static_cast<size_t>(p.batch * p.heads) * static_cast<size_t>(p.chunk + 2) *
         static_cast<size_t>(p.features * (p.head_dim + 1)) * acc_bytes(p.dtype);
}

cudaError_t rfa_causal_fwd_cuda(const RfaParams& p, cudaStream_t stream) {
  if (!valid(p)) return cudaErrorInvalidValue;
  if (p.batch * p.heads == 0) return cudaGetLastError();
  return p.dtype == DType::kFloat32 ? forward<float>(p, stream) : forward<double>(p, stream);
}

cudaError_t rfa_causal_bwd_cuda(const RfaParams& p, void* workspace, cudaStream_t stream) {
  if (!valid(p) || p.chunk < 1 || p.seqlen == 0) return cudaErrorInvalidValue;  // T = 0: handled by the caller
  if (p.batch * p.heads == 0) return cudaGetLastError();
  return p.dtype == DType::kFloat32 ? backward<float>(p, workspace, stream) : backward<double>(p, workspace, stream);
}

}  // namespace talk_hf
