// Plain-C++ contract between the torch bindings (csrc/*.cpp) and the CUDA kernels (csrc/cuda/*.cu).
// No torch headers here: the .cu files compile with nvcc alone (CI checks sm_80 and sm_90 without a GPU).
// All tensors are contiguous; layouts are given per field. Math: see talk_hf/talk_conv.py,
// talk_hf/dynamic_conv.py and talk_hf/rfa.py, whose *_ref functions are the specification.
#pragma once
#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__) || defined(TALK_HF_WITH_CUDA_TYPES)
#include <cuda_runtime.h>
#else
typedef struct CUstream_st* cudaStream_t;
typedef int cudaError_t;
#endif

namespace talk_hf {

enum class DType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };

struct TalkConvParams {
  int64_t batch, seqlen, channels, heads;  // B, T, C, H; head h owns channels [h*C/H, (h+1)*C/H)
  int64_t max_left, max_right;             // window reach; normaliser is max_left + max_right + 1
  bool has_right;                          // false: causal form, right end is t itself
  DType dtype;                             // dtype of every tensor below
  const void* x;                           // (B, T, C)
  const void* offset_left;                 // (B, T, H)
  const void* offset_right;                // (B, T, H), nullptr when !has_right
  void* out;                               // (B, T, C)                 forward only
  const void* grad_out;                    // (B, T, C)                 backward only
  void* grad_x;                            // (B, T, C)                 backward only
  void* grad_offset_left;                  // (B, T, H)                 backward only
  void* grad_offset_right;                 // (B, T, H) or nullptr      backward only
};

struct TalkStepParams {
  int64_t batch, seqlen, channels, heads, max_left;  // B, T (new tokens), C, H; the state has max_left + 2 rows
  DType dtype;                                       // dtype of x, offset_left and out
  const void* x;                                     // (B, T, C)
  const void* offset_left;                           // (B, T, H)
  const void* state;                                 // (B, max_left + 2, C), fp32 (fp64 for fp64 x)
  void* out;                                         // (B, T, C)
  void* new_state;                                   // (B, max_left + 2, C), like state
};

struct DynamicConvParams {
  int64_t batch, seqlen, channels, heads, kernel_size;  // B, T, C, H, K
  int64_t padding_left;                                 // P: tap k reads x[t + k - P]
  DType dtype;
  const void* x;            // (B, T, C)
  const void* weight;       // (B, T, H, K): normalised by the caller, or logits when softmax
  bool weight_broadcast;    // weight is one (H, K) LightConv kernel that every position reads (false: per position)
  bool softmax;             // normalise each (b, t, h) row of weight over K (softmax) inside the kernels
  double weight_dropout;    // DropConnect probability on the normalised taps (0: off; dropconnect.h)
  const int64_t* seed;      // (1,) on the device: DropConnect's seed (read by the kernels), when weight_dropout > 0
  void* out;                // (B, T, C)     forward only
  const void* grad_out;     // (B, T, C)     backward only
  void* grad_x;             // (B, T, C)     backward only
  void* grad_weight;        // (B, T, H, K)  backward only
};

struct ConvStepParams {
  int64_t batch, seqlen, channels, heads, kernel_size;  // B, T (new tokens), C, H, K
  DType dtype;                                          // dtype of every tensor below
  const void* x;                                        // (B, T, C)
  const void* weight;                                   // (B, T, H, K): normalised, or logits when softmax
  bool weight_broadcast;                                // weight is one (H, K) kernel for every position
  bool softmax;                                         // normalise each row of weight over K (softmax)
  const void* state;                                    // (B, K - 1, C): the last K - 1 inputs
  void* out;                                            // (B, T, C)
  void* new_state;                                      // (B, K - 1, C)
};

struct RfaParams {
  int64_t batch, seqlen, heads, features, head_dim;  // B, T, H, F, D; the state is (F, E) with E = D + 1
  int64_t chunk, num_chunks;                         // steps per checkpoint (0: none), N = rfa_num_chunks(T, chunk)
  double eps;                                        // lower bound of the normaliser
  DType dtype;                                       // kFloat32 or kFloat64 (the state dtype) for every tensor
  bool tf32;                                         // chunked products on tensor cores, TF32 operands (fp32)
  const void* q;                   // (B, T, H, F)
  const void* k;                   // (B, T, H, F)
  const void* v;                   // (B, T, H, D)
  const void* decay;               // (B, T, H) or nullptr (no gate)
  const void* initial_state;       // (B, H, F, E) or nullptr (zeros)
  void* out;                       // (B, T, H, D)        forward only
  void* state;                     // (B, H, F, E)        forward only: the final state
  void* checkpoints;               // (B, H, N, F, E)     written by the forward, read by the backward
  const void* grad_out;            // (B, T, H, D)        backward only
  const void* grad_state;          // (B, H, F, E) or nullptr
  void* grad_q;                    // (B, T, H, F)
  void* grad_k;                    // (B, T, H, F)
  void* grad_v;                    // (B, T, H, D)
  void* grad_decay;                // (B, T, H) or nullptr
  void* grad_initial_state;        // (B, H, F, E) or nullptr
};

struct RfaFeatureParams {
  int64_t rows, heads, frequencies, head_dim;  // B * T * H rows of x, H, D (2D features), d
  DType dtype;                                 // kFloat32 or kFloat64 for every tensor
  const void* x;                               // (B, T, H, d): row r belongs to head r % H
  const void* projection;                      // (H, D, d)
  const void* tau;                             // (H,) or nullptr (1)
  void* out;                                   // (B, T, H, 2D)
};

// CUDA entry points (csrc/cuda/*.cu). Each takes a device workspace of at least *_workspace_bytes(p)
// bytes (may be nullptr when that size is 0), enqueues on `stream` without host syncs, and returns
// cudaGetLastError().
size_t talk_conv_fwd_workspace_bytes(const TalkConvParams& p);
size_t talk_conv_bwd_workspace_bytes(const TalkConvParams& p);
cudaError_t talk_conv_fwd_cuda(const TalkConvParams& p, void* workspace, cudaStream_t stream);
cudaError_t talk_conv_bwd_cuda(const TalkConvParams& p, void* workspace, cudaStream_t stream);
size_t talk_conv_step_workspace_bytes(const TalkStepParams& p);
cudaError_t talk_conv_step_cuda(const TalkStepParams& p, void* workspace, cudaStream_t stream);

size_t dynamic_conv_fwd_workspace_bytes(const DynamicConvParams& p);
size_t dynamic_conv_bwd_workspace_bytes(const DynamicConvParams& p);
cudaError_t dynamic_conv_fwd_cuda(const DynamicConvParams& p, void* workspace, cudaStream_t stream);
cudaError_t dynamic_conv_bwd_cuda(const DynamicConvParams& p, void* workspace, cudaStream_t stream);
cudaError_t dynamic_conv_step_cuda(const ConvStepParams& p, cudaStream_t stream);

size_t rfa_causal_bwd_workspace_bytes(const RfaParams& p);
cudaError_t rfa_causal_fwd_cuda(const RfaParams& p, cudaStream_t stream);
cudaError_t rfa_causal_bwd_cuda(const RfaParams& p, void* workspace, cudaStream_t stream);
cudaError_t rfa_feature_map_cuda(const RfaFeatureParams& p, cudaStream_t stream);

}  // namespace talk_hf
