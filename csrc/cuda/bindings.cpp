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
  const at::Tensor orr = or_.has_value() ? or_->contiguous() : at::Tensor();
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
  const at::Tensor orr = or_.has_value() ? or_->contiguous() : at::Tensor();
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

DynamicConvParams conv_params(const at::Tensor& x, const at::Tensor& w, int64_t padding_left) {
  DynamicConvParams p{};
  p.batch = x.size(0);
  p.seqlen = x.size(1);
  p.channels = x.size(2);
  p.heads = w.size(2);
  p.kernel_size = w.size(3);
  p.padding_left = padding_left;
  p.dtype = to_dtype(x.scalar_type());
  p.x = x.data_ptr();
  p.weight = w.data_ptr();
  return p;
}

at::Tensor dynamic_conv_fwd_cuda_op(const at::Tensor& x_, const at::Tensor& w_, int64_t padding_left) {
  check_dynamic_conv_inputs(x_, w_);
  const c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor x = x_.contiguous(), w = w_.contiguous();
  at::Tensor out = at::empty_like(x);
  if (x.numel() == 0) return out;
  DynamicConvParams p = conv_params(x, w, padding_left);
  p.out = out.data_ptr();
  check_launch(dynamic_conv_fwd_cuda(p, c10::cuda::getCurrentCUDAStream()), "dynamic_conv_fwd");
  return out;
}

std::tuple<at::Tensor, at::Tensor> dynamic_conv_bwd_cuda_op(const at::Tensor& g_, const at::Tensor& x_,
                                                            const at::Tensor& w_, int64_t padding_left) {
  check_dynamic_conv_inputs(x_, w_);
  TORCH_CHECK(g_.sizes() == x_.sizes() && g_.scalar_type() == x_.scalar_type(),
              "dynamic_conv backward: grad_out must match x");
  const c10::cuda::CUDAGuard guard(x_.device());
  const at::Tensor g = g_.contiguous(), x = x_.contiguous(), w = w_.contiguous();
  at::Tensor gx = at::empty_like(x), gw = at::empty_like(w);
  if (x.numel() == 0) return {gx, gw.zero_()};
  DynamicConvParams p = conv_params(x, w, padding_left);
  p.grad_out = g.data_ptr();
  p.grad_x = gx.data_ptr();
  p.grad_weight = gw.data_ptr();
  at::Tensor ws = workspace(dynamic_conv_bwd_workspace_bytes(p), x);
  check_launch(dynamic_conv_bwd_cuda(p, ws.numel() ? ws.data_ptr() : nullptr, c10::cuda::getCurrentCUDAStream()),
               "dynamic_conv_bwd");
  return {gx, gw};
}

}  // namespace

TORCH_LIBRARY_IMPL(talk_hf, CUDA, m) {
  m.impl("talk_conv_fwd", &talk_conv_fwd_cuda_op);
  m.impl("talk_conv_bwd", &talk_conv_bwd_cuda_op);
  m.impl("dynamic_conv_fwd", &dynamic_conv_fwd_cuda_op);
  m.impl("dynamic_conv_bwd", &dynamic_conv_bwd_cuda_op);
}

}  // namespace talk_hf
