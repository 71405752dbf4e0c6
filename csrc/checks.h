// Input checks shared by the CPU and CUDA bindings. The Python wrappers check first with friendlier
// messages; these guard direct calls of torch.ops.talk_hf.*.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace talk_hf {

inline void check_talk_conv_inputs(const at::Tensor& x, const at::Tensor& offset_left,
                                   const c10::optional<at::Tensor>& offset_right, int64_t max_left,
                                   int64_t max_right) {
  TORCH_CHECK(x.dim() == 3, "talk_conv: x must be (B, T, C), got ", x.sizes());
  TORCH_CHECK(offset_left.dim() == 3 && offset_left.size(0) == x.size(0) && offset_left.size(1) == x.size(1),
              "talk_conv: offset_left must be (B, T, H), got ", offset_left.sizes(), " for x ", x.sizes());
  TORCH_CHECK(offset_left.size(2) > 0 && x.size(2) % offset_left.size(2) == 0,
              "talk_conv: channels ", x.size(2), " must be divisible by heads ", offset_left.size(2));
  TORCH_CHECK(offset_left.scalar_type() == x.scalar_type(), "talk_conv: offset_left dtype must match x");
  TORCH_CHECK(offset_left.device() == x.device(), "talk_conv: offset_left must be on x's device");
  TORCH_CHECK(max_left >= 0 && max_right >= 0, "talk_conv: max_left and max_right must be >= 0");
  if (offset_right.has_value()) {
    TORCH_CHECK(offset_right->sizes() == offset_left.sizes(), "talk_conv: offset_right must match offset_left");
    TORCH_CHECK(offset_right->scalar_type() == x.scalar_type(), "talk_conv: offset_right dtype must match x");
    TORCH_CHECK(offset_right->device() == x.device(), "talk_conv: offset_right must be on x's device");
  } else {
    TORCH_CHECK(max_right == 0, "talk_conv: max_right must be 0 without offset_right");
  }
}

inline void check_dynamic_conv_inputs(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.dim() == 3, "dynamic_conv: x must be (B, T, C), got ", x.sizes());
  TORCH_CHECK(weight.dim() == 4 && weight.size(0) == x.size(0) && weight.size(1) == x.size(1),
              "dynamic_conv: weight must be (B, T, H, K), got ", weight.sizes(), " for x ", x.sizes());
  TORCH_CHECK(weight.size(2) > 0 && x.size(2) % weight.size(2) == 0,
              "dynamic_conv: channels ", x.size(2), " must be divisible by heads ", weight.size(2));
  TORCH_CHECK(weight.size(3) > 0, "dynamic_conv: kernel size must be >= 1");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "dynamic_conv: weight dtype must match x");
  TORCH_CHECK(weight.device() == x.device(), "dynamic_conv: weight must be on x's device");
}

}  // namespace talk_hf
