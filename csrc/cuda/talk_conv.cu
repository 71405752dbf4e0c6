// CUDA kernels of the TaLK convolution. Specification: talk_hf/talk_conv.py (`talk_conv_ref`).
//
// Layouts (all contiguous, batch-first, channels-last):
//   x, out, grad_out, grad_x   (B, T, C)   at [(b*T + t)*C + c]
//   offsets, grad offsets      (B, T, H)   at [(b*T + t)*H + h];   head of channel c: h = c / R, R = C / H
//   sat, gsat (workspace)      (B, T+1, C) at [(b*(T+1) + i)*C + c] in the accumulation type; sat[i] = S_{i-1}
// Channels are the fastest index everywhere, so consecutive threads take consecutive channels (coalesced).
//
// Forward:  (1) prefix-sum kernel, one thread per (b, c), sequential over t -> sat
//           (2) gather kernel, one thread per (b, t, c) -> out
// Backward: (1) the same prefix-sum kernel -> sat; gsat zeroed with cudaMemsetAsync
//           (2) scatter kernel, one group of G lanes per (b, t, h) (G = power of two >= min(R, 32)): atomicAdd of
//               the window-end gradients into gsat; the offset gradients summed over the head's R channels with a
//               group shuffle reduction (deterministic) and written once per (b, t, h)
//           (3) reverse prefix-sum kernel, one thread per (b, c): grad_x[j] = sum_{i >= j+1} gsat[i]
// Workspace: forward  [sat]        backward [sat | gsat], each B*(T+1)*C accumulators, 256-byte aligned.
#include "common.cuh"
#include "talk_conv_math.h"
#include "talk_hf_kernels.h"

namespace talk_hf {
namespace {

using namespace cuda_detail;

// Problem sizes and constants shared by all kernels (passed by value).
template <typename acc_t>
struct TalkDims {
  int64_t B, T, C, H, R;
  int64_t max_left, max_right;
  bool has_right;
  acc_t norm;  // max_left + max_right + 1
};

template <typename acc_t>
TalkDims<acc_t> make_dims(const TalkConvParams& p) {
  TalkDims<acc_t> d;
  d.B = p.batch;
  d.T = p.seqlen;
  d.C = p.channels;
  d.H = p.heads;
  d.R = p.channels / p.heads;
  d.max_left = p.max_left;
  d.max_right = p.max_right;
  d.has_right = p.has_right;
  d.norm = static_cast<acc_t>(p.max_left + p.max_right + 1);
  return d;
}

// Number of accumulators in one (B, T+1, C) table.
inline int64_t table_elems(const TalkConvParams& p) { return p.batch * (p.seqlen + 1) * p.channels; }

inline bool is_empty(const TalkConvParams& p) { return p.batch == 0 || p.seqlen == 0 || p.channels == 0; }

inline bool valid_common(const TalkConvParams& p) {
  return valid_dtype(p.dtype) && p.batch > 0 && p.seqlen > 0 && p.channels > 0 && p.heads > 0 &&
         p.channels % p.heads == 0 && p.max_left >= 0 && p.max_right >= 0 && p.x != nullptr &&
         p.offset_left != nullptr && (!p.has_right || p.offset_right != nullptr);
}

// ------------------------------------------------------------------------------------------------ window ends

// Left end: S~(l - 1) is interpolated between sat[lo] and sat[hi]; rel = -offset_left * max_left.
template <typename acc_t, typename scalar_t>
__device__ __forceinline__ WindowEnd<acc_t> left_end(const scalar_t* __restrict__ offset_left, int64_t bth,
                                                     int64_t t, const TalkDims<acc_t>& d) {
  const acc_t rel = -to_acc(offset_left[bth]) * static_cast<acc_t>(d.max_left);
  return window_end<acc_t>(t, rel, d.T);
}

// Right end: S~(r) is interpolated between sat[lo + 1] and sat[hi + 1]; rel = offset_right * max_right.
// The returned lo/hi are already shifted by +1 (table rows, in [1, T]).
template <typename acc_t, typename scalar_t>
__device__ __forceinline__ WindowEnd<acc_t> right_end(const scalar_t* __restrict__ offset_right, int64_t bth,
                                                      int64_t t, const TalkDims<acc_t>& d) {
  const acc_t rel = to_acc(offset_right[bth]) * static_cast<acc_t>(d.max_right);
  WindowEnd<acc_t> w = window_end<acc_t>(t, rel, d.T);
  w.lo += 1;
  w.hi += 1;
  return w;
}

// table column `col` (rows strided by C): col[lo] + frac * (col[hi] - col[lo]).
template <typename acc_t>
__device__ __forceinline__ acc_t interpolate(const acc_t* __restrict__ col, int64_t C, const WindowEnd<acc_t>& w) {
  const acc_t at_lo = col[w.lo * C];
  const acc_t at_hi = col[w.hi * C];
  return at_lo + w.frac * (at_hi - at_lo);
}

// d interpolate / d frac = col[hi] - col[lo] (zero when clamped or on an integer position, where hi == lo).
template <typename acc_t>
__device__ __forceinline__ acc_t slope(const acc_t* __restrict__ col, int64_t C, const WindowEnd<acc_t>& w) {
  return col[w.hi * C] - col[w.lo * C];
}

// Adjoint of `interpolate`: col[lo] += (1 - frac) * grad, col[hi] += frac * grad.
template <typename acc_t>
__device__ __forceinline__ void scatter(acc_t* __restrict__ col, int64_t C, const WindowEnd<acc_t>& w, acc_t grad) {
  if (w.hi == w.lo) {  // frac == 0: the whole weight lands on lo
    atomicAdd(col + w.lo * C, grad);
  } else {
    atomicAdd(col + w.lo * C, (acc_t(1) - w.frac) * grad);
    atomicAdd(col + w.hi * C, w.frac * grad);
  }
}

// ------------------------------------------------------------------------------------------------ kernels

// sat[b, 0, c] = 0, sat[b, t+1, c] = sum_{i<=t} x[b, i, c]. One thread per (b, c), n = b*C + c.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    talk_prefix_sum_kernel(const scalar_t* __restrict__ x, acc_type<scalar_t>* __restrict__ sat, int64_t B,
                           int64_t T, int64_t C) {
  using acc_t = acc_type<scalar_t>;
  const int64_t n_cols = B * C;
  for (int64_t n = global_thread_id(); n < n_cols; n += global_thread_count()) {
    const int64_t b = n / C;
    const int64_t c = n - b * C;
    const scalar_t* xcol = x + b * T * C + c;
    acc_t* scol = sat + b * (T + 1) * C + c;
    acc_t s = acc_t(0);
    scol[0] = s;
    for (int64_t t = 0; t < T; ++t) {
      s += to_acc(xcol[t * C]);
      scol[(t + 1) * C] = s;
    }
  }
}

// out[b, t, c] = (S~(r) - S~(l - 1)) / norm. One thread per (b, t, c), n = (b*T + t)*C + c.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    talk_fwd_gather_kernel(const acc_type<scalar_t>* __restrict__ sat, const scalar_t* __restrict__ offset_left,
                           const scalar_t* __restrict__ offset_right, scalar_t* __restrict__ out,
                           TalkDims<acc_type<scalar_t>> d) {
  using acc_t = acc_type<scalar_t>;
  const int64_t total = d.B * d.T * d.C;
  for (int64_t n = global_thread_id(); n < total; n += global_thread_count()) {
    const int64_t bt = n / d.C;
    const int64_t c = n - bt * d.C;
    const int64_t b = bt / d.T;
    const int64_t t = bt - b * d.T;
    const int64_t bth = bt * d.H + c / d.R;
    const acc_t* col = sat + b * (d.T + 1) * d.C + c;

    const acc_t left = interpolate(col, d.C, left_end(offset_left, bth, t, d));
    const acc_t right = d.has_right ? interpolate(col, d.C, right_end(offset_right, bth, t, d)) : col[(t + 1) * d.C];
    out[n] = from_acc<scalar_t>((right - left) / d.norm);
  }
}

// Per (b, t, h): scatter grad_out / norm into gsat at the window ends (atomics) and write
// grad_offset_left = max_left * sum_c (g/norm) * slope_left, grad_offset_right = max_right * sum_c (g/norm) * slope_right.
// Signs: out = (right - left)/norm with rel_left = -offset_left*max_left, so d out/d offset_left = +max_left*slope/norm
// and d out/d offset_right = +max_right*slope/norm.
// Each group of G lanes owns one (b, t, h) (group id = (b*T + t)*H + h); its lanes stride over the head's R channels.
// The loop bound is warp-uniform so that every lane reaches the shuffles.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    talk_bwd_scatter_kernel(const acc_type<scalar_t>* __restrict__ sat, acc_type<scalar_t>* __restrict__ gsat,
                            const scalar_t* __restrict__ offset_left, const scalar_t* __restrict__ offset_right,
                            const scalar_t* __restrict__ grad_out, scalar_t* __restrict__ grad_offset_left,
                            scalar_t* __restrict__ grad_offset_right, TalkDims<acc_type<scalar_t>> d, int group) {
  using acc_t = acc_type<scalar_t>;
  const int lane = static_cast<int>(threadIdx.x % kWarpSize);
  const int r0 = lane % group;
  const int64_t groups_per_warp = kWarpSize / group;
  const int64_t n_groups = d.B * d.T * d.H;
  const int64_t warp = global_thread_id() / kWarpSize;
  const int64_t n_warps = global_thread_count() / kWarpSize;

  for (int64_t base = warp * groups_per_warp; base < n_groups; base += n_warps * groups_per_warp) {
    const int64_t bth = base + lane / group;
    const bool active = bth < n_groups;
    acc_t sum_left = acc_t(0), sum_right = acc_t(0);  // sum_c (g/norm) * slope
    if (active) {
      const int64_t bt = bth / d.H;
      const int64_t h = bth - bt * d.H;
      const int64_t b = bt / d.T;
      const int64_t t = bt - b * d.T;
      const WindowEnd<acc_t> L = left_end(offset_left, bth, t, d);
      WindowEnd<acc_t> Rw = {t + 1, t + 1, acc_t(0)};  // causal: the right end is S_t = sat[t + 1]
      if (d.has_right) Rw = right_end(offset_right, bth, t, d);
      for (int64_t r = r0; r < d.R; r += group) {
        const int64_t c = h * d.R + r;
        const acc_t gn = to_acc(grad_out[bt * d.C + c]) / d.norm;
        const int64_t col_off = b * (d.T + 1) * d.C + c;
        scatter(gsat + col_off, d.C, L, -gn);  // left enters with a minus sign
        scatter(gsat + col_off, d.C, Rw, gn);
        sum_left += gn * slope(sat + col_off, d.C, L);
        if (d.has_right) sum_right += gn * slope(sat + col_off, d.C, Rw);
      }
    }
    sum_left = group_reduce_sum(sum_left, group);
    sum_right = group_reduce_sum(sum_right, group);
    if (active && r0 == 0) {
      grad_offset_left[bth] = from_acc<scalar_t>(static_cast<acc_t>(d.max_left) * sum_left);
      if (d.has_right) grad_offset_right[bth] = from_acc<scalar_t>(static_cast<acc_t>(d.max_right) * sum_right);
    }
  }
}

// grad_x[b, j, c] = sum_{i >= j+1} gsat[b, i, c] (gsat[b, 0, c] is the gradient of S_{-1} = 0 and is dropped).
// One thread per (b, c), n = b*C + c.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    talk_reverse_sum_kernel(const acc_type<scalar_t>* __restrict__ gsat, scalar_t* __restrict__ grad_x, int64_t B,
                            int64_t T, int64_t C) {
  using acc_t = acc_type<scalar_t>;
  const int64_t n_cols = B * C;
  for (int64_t n = global_thread_id(); n < n_cols; n += global_thread_count()) {
    const int64_t b = n / C;
    const int64_t c = n - b * C;
    const acc_t* gcol = gsat + b * (T + 1) * C + c;
    scalar_t* gxcol = grad_x + b * T * C + c;
    acc_t s = acc_t(0);
    for (int64_t j = T - 1; j >= 0; --j) {
      s += gcol[(j + 1) * C];
      gxcol[j * C] = from_acc<scalar_t>(s);
    }
  }
}

// ------------------------------------------------------------------------------------------------ launchers

template <typename scalar_t>
void launch_prefix_sum(const TalkConvParams& p, acc_type<scalar_t>* sat, cudaStream_t stream) {
  const unsigned blocks = grid_blocks(ceil_div(p.batch * p.channels, kThreads));
  talk_prefix_sum_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(static_cast<const scalar_t*>(p.x), sat,
                                                                     p.batch, p.seqlen, p.channels);
}

template <typename scalar_t>
cudaError_t launch_fwd(const TalkConvParams& p, void* workspace, cudaStream_t stream) {
  using acc_t = acc_type<scalar_t>;
  acc_t* sat = static_cast<acc_t*>(workspace);
  launch_prefix_sum<scalar_t>(p, sat, stream);

  const unsigned blocks = grid_blocks(ceil_div(p.batch * p.seqlen * p.channels, kThreads));
  talk_fwd_gather_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
      sat, static_cast<const scalar_t*>(p.offset_left), static_cast<const scalar_t*>(p.offset_right),
      static_cast<scalar_t*>(p.out), make_dims<acc_t>(p));
  return cudaGetLastError();
}

template <typename scalar_t>
cudaError_t launch_bwd(const TalkConvParams& p, void* workspace, cudaStream_t stream) {
  using acc_t = acc_type<scalar_t>;
  const size_t table_bytes = align_up(static_cast<size_t>(table_elems(p)) * sizeof(acc_t));
  acc_t* sat = static_cast<acc_t*>(workspace);
  acc_t* gsat = reinterpret_cast<acc_t*>(static_cast<char*>(workspace) + table_bytes);

  launch_prefix_sum<scalar_t>(p, sat, stream);
  cudaError_t err = cudaMemsetAsync(gsat, 0, static_cast<size_t>(table_elems(p)) * sizeof(acc_t), stream);
  if (err != cudaSuccess) return err;

  const int group = group_size_for(p.channels / p.heads);
  const int64_t groups_per_block = kThreads / group;
  const unsigned blocks = grid_blocks(ceil_div(p.batch * p.seqlen * p.heads, groups_per_block));
  talk_bwd_scatter_kernel<scalar_t><<<blocks, kThreads, 0, stream>>>(
      sat, gsat, static_cast<const scalar_t*>(p.offset_left), static_cast<const scalar_t*>(p.offset_right),
      static_cast<const scalar_t*>(p.grad_out), static_cast<scalar_t*>(p.grad_offset_left),
      static_cast<scalar_t*>(p.grad_offset_right), make_dims<acc_t>(p), group);

  const unsigned scan_blocks = grid_blocks(ceil_div(p.batch * p.channels, kThreads));
  talk_reverse_sum_kernel<scalar_t><<<scan_blocks, kThreads, 0, stream>>>(
      gsat, static_cast<scalar_t*>(p.grad_x), p.batch, p.seqlen, p.channels);
  return cudaGetLastError();
}

}  // namespace

// ------------------------------------------------------------------------------------------------ entry points

size_t talk_conv_fwd_workspace_bytes(const TalkConvParams& p) {
  if (is_empty(p)) return 0;
  return align_up(static_cast<size_t>(table_elems(p)) * acc_bytes(p.dtype));  // sat
}

size_t talk_conv_bwd_workspace_bytes(const TalkConvParams& p) {
  if (is_empty(p)) return 0;
  return 2 * align_up(static_cast<size_t>(table_elems(p)) * acc_bytes(p.dtype));  // sat | gsat
}

cudaError_t talk_conv_fwd_cuda(const TalkConvParams& p, void* workspace, cudaStream_t stream) {
  if (is_empty(p)) return cudaSuccess;
  if (!valid_common(p) || p.out == nullptr || workspace == nullptr) return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  DISPATCH_DTYPE(p.dtype, scalar_t, err = launch_fwd<scalar_t>(p, workspace, stream));
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
