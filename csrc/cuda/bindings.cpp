// CUDA implementations of the talk_hf operators: checks, output and workspace allocation (through the
// caching allocator), parameter packing and the launch on the current stream. Kernels: csrc/cuda/*.cu.
#define TALK_HF_WITH_CUDA_TYPES
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAStream.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "../checks.h"
#include "../talk_hf_kernels.h"

namespace talk_hf {
namespace {

DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: TORCH_CHECK(false, "talk_hf CUDA kernels support fp32, fp64, fp16 and bf16, got ", t);
  }
}

at::Tensor workspace(size_t bytes, const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, " CUDA launch failed: ", cudaGetErrorString(err));
}

TalkConvParams talk_params(const at::Tensor& x, const at::Tensor& ol, const at::Tensor& orr, int64_t max_left,
                           int64_t max_right) {
  TalkConvParams p{};
  p.batch = x.size(0);
  p.seqlen = x.size(1);
  p.channels = x.size(2);
  p.heads = ol.size(2);
  p.max_left = max_left;
  p.max_right = max_right;
  p.has_right = orr.defined();
  p.dtype = to_dtype(x.scalar_type());
  p.x = x.data_ptr();
  p.offset_left = ol.data_ptr();
  p.offset_right = orr.defined() ? orr.data_ptr() : nullptr;
  return p;
}

at::Tensor talk_conv_fwd_cuda_op(const at::Tensor& x_, const at::Tensor& ol_, const c10::optional<at::Tensor>& or_,
                                 int64_t max_left, int64_t max_right) {
  check_talk_conv_inputs(x_, ol_, or_, max_left, max_right);
  const c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous(), ol = ol_.contiguous();
  const at::Tensor orr = contiguous_or_undefined(or_);
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0) return out;
  TalkConvParams p = talk_params(x, ol, orr, max_left, max_right);
  p.out = out.data_ptr();
  at::Tensor ws = workspace(talk_conv_fwd_workspace_bytes(p), x);
  check_launch(talk_conv_fwd_cuda(p, ws.numel() ? ws.data_ptr() : nullptr, c10::cuda::getCurrentCUDAStream()),
               "talk_conv_fwd");
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> talk_conv_bwd_cuda_op(const at::Tensor& g_, const at::Tensor& x_,
                                                                     const at::Tensor& ol_,
                                                                     const c10::optional<at::Tensor>& or_,
                                                                     int64_t max_left, int64_t max_right) {
  check_talk_conv_inputs(x_, ol_, or_, max_left, max_right);
  TORCH_CHECK(g_.sizes() == x_.sizes() && g_.scalar_type() == x_.scalar_type(),
              "talk_conv backward: grad_out must match x");
  const c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor g = g_.contiguous(), x = x_.contiguous(), ol = ol_.contiguous();
  const at::Tensor orr = contiguous_or_undefined(or_);
  at::Tensor gx = at::empty_like(x), gol = at::empty_like(ol);
  at::Tensor gor = or_.has_value() ? at::empty_like(ol) : at::empty({0}, ol.options());
  if (x.numel() == 0) return {gx, gol.zero_(), gor.zero_()};
  TalkConvParams p = talk_params(x, ol, orr, max_left, max_right);
  p.grad_out = g.data_ptr();
  p.grad_x = gx.data_ptr();
  p.grad_offset_left = gol.data_ptr();
  p.grad_offset_right = or_.has_value() ? gor.data_ptr() : nullptr;
  at::Tensor ws = workspace(talk_conv_bwd_workspace_bytes(p), x);
  check_launch(talk_conv_bwd_cuda(p, ws.numel() ? ws.data_ptr() : nullptr, c10::cuda::getCurrentCUDAStream()),
               "talk_conv_bwd");
  return {gx, gol, gor};
}

std::tuple<at::Tensor, at::Tensor> talk_conv_step_cuda_op(const at::Tensor& x_, const at::Tensor& ol_,
                                                          const at::Tensor& state_, int64_t max_left) {
  check_talk_conv_step_inputs(x_, ol_, state_, max_left);
  const c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous(), ol = ol_.contiguous(), state = state_.contiguous();
  at::Tensor out = at::empty_like(x), new_state = at::empty_like(state);
  if (x.numel() == 0) return {out, new_state.copy_(state)};
  TalkStepParams p{};
  p.batch = x.size(0);
  p.seqlen = x.size(1);
  p.channels = x.size(2);
  p.heads = ol.size(2);
  p.max_left = max_left;
  p.dtype = to_dtype(x.scalar_type());
  p.x = x.data_ptr();
  p.offset_left = ol.data_ptr();
  p.state = state.data_ptr();
  p.out = out.data_ptr();
  p.new_state = new_state.data_ptr();
  at::Tensor ws = workspace(talk_conv_step_workspace_bytes(p), x);
  check_launch(talk_conv_step_cuda(p, ws.data_ptr(), c10::cuda::getCurrentCUDAStream()), "talk_conv_step");
  return {out, new_state};
}

// x contiguous; w: the (B, T, H, K) weight as given (sizes); cw: how the kernels read it (kept alive by the caller);
// seed: DropConnect's, checked (one element, so contiguous) when weight_dropout > 0.
DynamicConvParams conv_params(const at::Tensor& x, const at::Tensor& w, const ConvWeight& cw, int64_t padding_left,
                              bool softmax, const c10::optional<at::Tensor>& seed, double weight_dropout) {
  DynamicConvParams p{};
  p.softmax = softmax;
  p.weight_dropout = weight_dropout;
  p.seed = weight_dropout > 0.0 ? seed->data_ptr<int64_t>() : nullptr;
  p.batch = x.size(0);
  p.seqlen = x.size(1);
  p.channels = x.size(2);
  p.heads = w.size(2);
  p.kernel_size = w.size(3);
  p.padding_left = padding_left;
  p.dtype = to_dtype(x.scalar_type());
  p.x = x.data_ptr();
  p.weight = cw.data.data_ptr();
  p.weight_broadcast = cw.broadcast;
  return p;
}

at::Tensor dynamic_conv_fwd_cuda_op(const at::Tensor& x_, const at::Tensor& w_, int64_t padding_left,
                                    bool softmax, const c10::optional<at::Tensor>& seed, double weight_dropout) {
  check_dynamic_conv_inputs(x_, w_);
  check_dropconnect_args(x_, seed, weight_dropout);
  const c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous();
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0) return out;
  const ConvWeight cw = conv_weight(w_);
  DynamicConvParams p = conv_params(x, w_, cw, padding_left, softmax, seed, weight_dropout);
  p.out = out.data_ptr();
  at::Tensor ws = workspace(dynamic_conv_fwd_workspace_bytes(p), x);
  check_launch(dynamic_conv_fwd_cuda(p, ws.numel() ? ws.data_ptr() : nullptr, c10::cuda::getCurrentCUDAStream()),
               "dynamic_conv_fwd");
  return out;
}

std::tuple<at::Tensor, at::Tensor> dynamic_conv_step_cuda_op(const at::Tensor& x_, const at::Tensor& w_,
                                                             const at::Tensor& state_, bool softmax) {
  check_dynamic_conv_step_inputs(x_, w_, state_);
  const c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous(), state = state_.contiguous();
  at::Tensor out = at::empty_like(x), new_state = at::empty_like(state);
  if (x.numel() == 0) return {out, new_state.copy_(state)};
  const ConvWeight cw = conv_weight(w_);
  ConvStepParams p{};
  p.batch = x.size(0);
  p.seqlen = x.size(1);
  p.channels = x.size(2);
  p.heads = w_.size(2);
  p.kernel_size = w_.size(3);
  p.dtype = to_dtype(x.scalar_type());
  p.x = x.data_ptr();
  p.weight = cw.data.data_ptr();
  p.weight_broadcast = cw.broadcast;
  p.softmax = softmax;
  p.state = state.numel() ? state.data_ptr() : nullptr;
  p.out = out.data_ptr();
  p.new_state = new_state.numel() ? new_state.data_ptr() : nullptr;
  check_launch(dynamic_conv_step_cuda(p, c10::cuda::getCurrentCUDAStream()), "dynamic_conv_step");
  return {out, new_state};
}

std::tuple<at::Tensor, at::Tensor> dynamic_conv_bwd_cuda_op(const at::Tensor& g_, const at::Tensor& x_,
                                                            const at::Tensor& w_, int64_t padding_left,
                                                            bool softmax, const c10::optional<at::Tensor>& seed,
                                                            double weight_dropout) {
  check_dynamic_conv_inputs(x_, w_);
  check_dropconnect_args(x_, seed, weight_dropout);
  TORCH_CHECK(g_.sizes() == x_.sizes() && g_.scalar_type() == x_.scalar_type(),
              "dynamic_conv backward: grad_out must match x");
  const c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor g = g_.contiguous(), x = x_.contiguous();
  at::Tensor gx = at::empty_like(x), gw = at::empty(w_.sizes(), w_.options());  // per position, also for LightConv
  if (x.numel() == 0) return {gx, gw.zero_()};
  const ConvWeight cw = conv_weight(w_);
  DynamicConvParams p = conv_params(x, w_, cw, padding_left, softmax, seed, weight_dropout);
  p.grad_out = g.data_ptr();
  p.grad_x = gx.data_ptr();
  p.grad_weight = gw.data_ptr();
  at::Tensor ws = workspace(dynamic_conv_bwd_workspace_bytes(p), x);
  check_launch(dynamic_conv_bwd_cuda(p, ws.numel() ? ws.data_ptr() : nullptr, c10::cuda::getCurrentCUDAStream()),
               "dynamic_conv_bwd");
  return {gx, gw};
}

RfaParams rfa_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& decay,
                     const at::Tensor& init, double eps, int64_t chunk, bool tf32) {
  RfaParams p{};
  p.batch = q.size(0);
  p.seqlen = q.size(1);
  p.heads = q.size(2);
  p.features = q.size(3);
  p.head_dim = v.size(3);
  p.chunk = chunk;
  p.num_chunks = rfa_num_chunks(p.seqlen, chunk);
  p.eps = eps;
  p.dtype = to_dtype(q.scalar_type());
  p.tf32 = tf32;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.decay = decay.defined() ? decay.data_ptr() : nullptr;
  p.initial_state = init.defined() ? init.data_ptr() : nullptr;
  return p;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rfa_causal_fwd_cuda_op(const at::Tensor& q_, const at::Tensor& k_,
                                                                      const at::Tensor& v_,
                                                                      const c10::optional<at::Tensor>& decay_,
                                                                      const c10::optional<at::Tensor>& init_,
                                                                      double eps, int64_t chunk, bool tf32) {
  check_rfa_inputs(q_, k_, v_, decay_, init_, chunk);
  const c10::cuda::CUDAGuard guard(q_.device());
  const at::Tensor q = q_.contiguous(), k = k_.contiguous(), v = v_.contiguous();
  const at::Tensor decay = contiguous_or_undefined(decay_), init = contiguous_or_undefined(init_);
  RfaParams p = rfa_params(q, k, v, decay, init, eps, chunk, tf32);
  at::Tensor out = at::empty_like(v);
  at::Tensor state = at::empty({p.batch, p.heads, p.features, p.head_dim + 1}, v.options());
  at::Tensor checkpoints = at::empty({p.batch, p.heads, p.num_chunks, p.features, p.head_dim + 1}, v.options());
  p.out = out.data_ptr();
  p.state = state.data_ptr();
  p.checkpoints = checkpoints.data_ptr();
  check_launch(rfa_causal_fwd_cuda(p, c10::cuda::getCurrentCUDAStream()), "rfa_causal_fwd");
  return {out, state, checkpoints};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rfa_causal_bwd_cuda_op(
    const at::Tensor& go_, const c10::optional<at::Tensor>& gstate_, const at::Tensor& q_, const at::Tensor& k_,
    const at::Tensor& v_, const c10::optional<at::Tensor>& decay_, const c10::optional<at::Tensor>& init_,
    const at::Tensor& checkpoints_, double eps, int64_t chunk, bool tf32) {
  check_rfa_inputs(q_, k_, v_, decay_, init_, chunk);
  check_rfa_backward_inputs(go_, gstate_, checkpoints_, q_, v_, chunk);
  const c10::cuda::CUDAGuard guard(q_.device());
  const at::Tensor go = go_.contiguous(), q = q_.contiguous(), k = k_.contiguous(), v = v_.contiguous();
  const at::Tensor gstate = contiguous_or_undefined(gstate_), checkpoints = checkpoints_.contiguous();
  const at::Tensor decay = contiguous_or_undefined(decay_), init = contiguous_or_undefined(init_);
  at::Tensor gq = at::empty_like(q), gk = at::empty_like(k), gv = at::empty_like(v);
  at::Tensor gdecay = decay.defined() ? at::empty_like(decay) : at::empty({0}, q.options());
  at::Tensor ginit = init.defined() ? at::empty_like(init) : at::empty({0}, q.options());
  if (q.size(1) == 0) {  // the final state is the initial state
    if (init.defined()) gstate.defined() ? ginit.copy_(gstate) : ginit.zero_();
    return {gq, gk, gv, gdecay, ginit};
  }
  RfaParams p = rfa_params(q, k, v, decay, init, eps, chunk, tf32);
  p.checkpoints = const_cast<void*>(checkpoints.data_ptr());
  p.grad_out = go.data_ptr();
  p.grad_state = gstate.defined() ? gstate.data_ptr() : nullptr;
  p.grad_q = gq.data_ptr();
  p.grad_k = gk.data_ptr();
  p.grad_v = gv.data_ptr();
  p.grad_decay = decay.defined() ? gdecay.data_ptr() : nullptr;
  p.grad_initial_state = init.defined() ? ginit.data_ptr() : nullptr;
  at::Tensor ws = workspace(rfa_causal_bwd_workspace_bytes(p), q);
  check_launch(rfa_causal_bwd_cuda(p, ws.numel() ? ws.data_ptr() : nullptr, c10::cuda::getCurrentCUDAStream()),
               "rfa_causal_bwd");
  return {gq, gk, gv, gdecay, ginit};
}

at::Tensor rfa_causal_step_cuda_op(const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_,
                                   const c10::optional<at::Tensor>& decay_, at::Tensor& state, double eps) {
  check_rfa_inputs(q_, k_, v_, decay_, state, 0, "rfa_causal_step_", "state");
  check_in_place_state(state);
  const c10::cuda::CUDAGuard guard(q_.device());
  const at::Tensor q = q_.contiguous(), k = k_.contiguous(), v = v_.contiguous();
  const at::Tensor decay = contiguous_or_undefined(decay_);
  RfaParams p = rfa_params(q, k, v, decay, state, eps, 0, false);  // the state is the initial state ...
  at::Tensor out = at::empty_like(v);
  p.out = out.data_ptr();
  p.state = state.data_ptr();  // ... and receives the final one: every kernel reads it before writing it
  check_launch(rfa_causal_fwd_cuda(p, c10::cuda::getCurrentCUDAStream()), "rfa_causal_step_");
  return out;
}

at::Tensor rfa_feature_map_cuda_op(const at::Tensor& x_, const at::Tensor& projection_,
                                   const c10::optional<at::Tensor>& tau_) {
  check_rfa_feature_map_inputs(x_, projection_, tau_);
  const c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous(), projection = projection_.contiguous();
  const at::Tensor tau = contiguous_or_undefined(tau_);
  at::Tensor out = at::empty({x.size(0), x.size(1), x.size(2), 2 * projection.size(1)}, x.options());
  if (out.numel() == 0) return out;
  RfaFeatureParams p{};
  p.rows = x.size(0) * x.size(1) * x.size(2);
  p.heads = x.size(2);
  p.frequencies = projection.size(1);
  p.head_dim = x.size(3);
  p.dtype = to_dtype(x.scalar_type());
  p.x = x.data_ptr();
  p.projection = projection.data_ptr();
  p.tau = tau.defined() ? tau.data_ptr() : nullptr;
  p.out = out.data_ptr();
  check_launch(rfa_feature_map_cuda(p, c10::cuda::getCurrentCUDAStream()), "rfa_feature_map");
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(talk_hf, CUDA, m) {
  m.impl("rfa_causal_fwd", &rfa_causal_fwd_cuda_op);
  m.impl("rfa_causal_bwd", &rfa_causal_bwd_cuda_op);
  m.impl("rfa_causal_step_", &rfa_causal_step_cuda_op);
  m.impl("talk_conv_fwd", &talk_conv_fwd_cuda_op);
  m.impl("talk_conv_bwd", &talk_conv_bwd_cuda_op);
  m.impl("talk_conv_step", &talk_conv_step_cuda_op);
  m.impl("dynamic_conv_fwd", &dynamic_conv_fwd_cuda_op);
  m.impl("dynamic_conv_bwd", &dynamic_conv_bwd_cuda_op);
  m.impl("dynamic_conv_step", &dynamic_conv_step_cuda_op);
  m.impl("rfa_feature_map", &rfa_feature_map_cuda_op);
}

}  // namespace talk_hf
