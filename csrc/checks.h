// Input checks, and the handling of optional tensor arguments, shared by the CPU and CUDA bindings. The Python
// wrappers check first with friendlier messages; these guard direct calls of torch.ops.talk_hf.*.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "rfa_math.h"

#include <vector>

namespace talk_hf {

// An optional tensor argument as a contiguous tensor, or an undefined one when it was not given.
inline at::Tensor contiguous_or_undefined(const c10::optional<at::Tensor>& t) {
  return t.has_value() ? t->contiguous() : at::Tensor();
}

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

// x (B, T, C), offset_left (B, T, H) as for talk_conv; state (B, max_left + 2, C) in the accumulation dtype.
inline void check_talk_conv_step_inputs(const at::Tensor& x, const at::Tensor& offset_left, const at::Tensor& state,
                                        int64_t max_left) {
  check_talk_conv_inputs(x, offset_left, c10::nullopt, max_left, 0);
  TORCH_CHECK(state.dim() == 3 && state.size(0) == x.size(0) && state.size(1) == max_left + 2 &&
                  state.size(2) == x.size(2),
              "talk_conv_step: state must be (B, max_left + 2, C) = (", x.size(0), ", ", max_left + 2, ", ", x.size(2),
              "), got ", state.sizes());
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK(state.scalar_type() == acc, "talk_conv_step: state must be ", acc, " for ", x.scalar_type(),
              " inputs, got ", state.scalar_type());
  TORCH_CHECK(state.device() == x.device(), "talk_conv_step: state must be on x's device");
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

// DropConnect's arguments: weight_dropout in [0, 1]; when it is > 0, seed is a one-element int64 tensor on x's
// device (csrc/dropconnect.h draws the mask from it).
inline void check_dropconnect_args(const at::Tensor& x, const c10::optional<at::Tensor>& seed,
                                   double weight_dropout) {
  TORCH_CHECK(weight_dropout >= 0.0 && weight_dropout <= 1.0, "dynamic_conv: weight_dropout must be in [0, 1], got ",
              weight_dropout);
  if (weight_dropout == 0.0) return;
  TORCH_CHECK(seed.has_value() && seed->defined(), "dynamic_conv: weight_dropout > 0 needs a seed");
  TORCH_CHECK(seed->scalar_type() == at::kLong && seed->numel() == 1,
              "dynamic_conv: seed must be a one-element int64 tensor, got ", seed->scalar_type(), " ", seed->sizes());
  TORCH_CHECK(seed->device() == x.device(), "dynamic_conv: seed must be on x's device");
}

// The dynamic-convolution weight as the kernels read it: `data` is the (B, T, H, K) weight made contiguous, or,
// when `broadcast`, the one (H, K) LightConv kernel that expand() spread over (B, T) (read in place by every
// position instead of being copied out B*T times).
struct ConvWeight {
  at::Tensor data;
  bool broadcast;
};

inline ConvWeight conv_weight(const at::Tensor& weight) {
  if (weight.size(0) > 0 && weight.size(1) > 0 && weight.stride(0) == 0 && weight.stride(1) == 0)
    return {weight.select(0, 0).select(0, 0).contiguous(), true};
  return {weight.contiguous(), false};
}

// x (B, T, C) and weight (B, T, H, K) as for dynamic_conv; state (B, K - 1, C) in x's dtype.
inline void check_dynamic_conv_step_inputs(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& state) {
  check_dynamic_conv_inputs(x, weight);
  TORCH_CHECK(state.dim() == 3 && state.size(0) == x.size(0) && state.size(1) == weight.size(3) - 1 &&
                  state.size(2) == x.size(2),
              "dynamic_conv_step: state must be (B, K - 1, C) = (", x.size(0), ", ", weight.size(3) - 1, ", ",
              x.size(2), "), got ", state.sizes());
  TORCH_CHECK(state.scalar_type() == x.scalar_type(), "dynamic_conv_step: state dtype must match x");
  TORCH_CHECK(state.device() == x.device(), "dynamic_conv_step: state must be on x's device");
}

// The state of rfa_causal_step_, advanced in place: one dense buffer the kernels can write.
inline void check_in_place_state(const at::Tensor& state) {
  TORCH_CHECK(state.is_contiguous(), "rfa_causal_step_: state must be contiguous (it is updated in place)");
}

// q, k: (B, T, H, F); v: (B, T, H, D); decay: (B, T, H); initial_state: (B, H, F, D + 1); one float dtype.
// op, state: the names the errors give the op and its state argument (rfa_causal_step_ calls it `state`).
inline void check_rfa_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const c10::optional<at::Tensor>& decay, const c10::optional<at::Tensor>& initial_state,
                             int64_t chunk, const char* op = "rfa_causal", const char* state = "initial_state") {
  TORCH_CHECK(q.dim() == 4, op, ": q must be (B, T, H, F), got ", q.sizes());
  TORCH_CHECK(k.sizes() == q.sizes(), op, ": k must match q ", q.sizes(), ", got ", k.sizes());
  TORCH_CHECK(v.dim() == 4 && v.size(0) == q.size(0) && v.size(1) == q.size(1) && v.size(2) == q.size(2),
              op, ": v must be (B, T, H, D) for q ", q.sizes(), ", got ", v.sizes());
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble,
              op, ": the kernel takes fp32 or fp64 inputs (the state dtype), got ", q.scalar_type());
  TORCH_CHECK(chunk >= 0, op, ": chunk must be >= 0, got ", chunk);
  auto same = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.scalar_type() == q.scalar_type(), op, ": ", name, " dtype must match q");
    TORCH_CHECK(t.device() == q.device(), op, ": ", name, " must be on q's device");
  };
  same(k, "k");
  same(v, "v");
  if (decay.has_value()) {
    same(*decay, "decay");
    TORCH_CHECK(decay->sizes() == q.sizes().slice(0, 3), op, ": decay must be (B, T, H), got ", decay->sizes());
  }
  if (initial_state.has_value()) {
    same(*initial_state, state);
    TORCH_CHECK(initial_state->sizes() == at::IntArrayRef({q.size(0), q.size(2), q.size(3), v.size(3) + 1}),
                op, ": ", state, " must be (B, H, F, D + 1), got ", initial_state->sizes());
  }
}

inline void check_rfa_backward_inputs(const at::Tensor& grad_out, const c10::optional<at::Tensor>& grad_state,
                                      const at::Tensor& checkpoints, const at::Tensor& q, const at::Tensor& v,
                                      int64_t chunk) {
  TORCH_CHECK(chunk >= 1, "rfa_causal backward: chunk must be >= 1 (a forward with chunk 0 saved no states), got ",
              chunk);
  const int64_t num_chunks = rfa_num_chunks(q.size(1), chunk);
  TORCH_CHECK(grad_out.sizes() == v.sizes() && grad_out.scalar_type() == v.scalar_type(),
              "rfa_causal backward: grad_out must match v");
  const std::vector<int64_t> state{q.size(0), q.size(2), q.size(3), v.size(3) + 1};
  if (grad_state.has_value()) {
    TORCH_CHECK(grad_state->sizes() == at::IntArrayRef(state) && grad_state->scalar_type() == q.scalar_type(),
                "rfa_causal backward: grad_state must be (B, H, F, D + 1) like the state");
  }
  TORCH_CHECK(checkpoints.dim() == 5 && checkpoints.size(0) == state[0] && checkpoints.size(1) == state[1] &&
                  checkpoints.size(2) == num_chunks && checkpoints.size(3) == state[2] &&
                  checkpoints.size(4) == state[3] && checkpoints.scalar_type() == q.scalar_type(),
              "rfa_causal backward: checkpoints must be (B, H, ceil(T / chunk), F, D + 1) from the forward, got ",
              checkpoints.sizes());
}

// x: (B, T, H, d); projection: (H, D, d); tau: (H,); one dtype, fp32 or fp64 (the accumulation dtype).
inline void check_rfa_feature_map_inputs(const at::Tensor& x, const at::Tensor& projection,
                                         const c10::optional<at::Tensor>& tau) {
  TORCH_CHECK(x.dim() == 4, "rfa_feature_map: x must be (B, T, H, d), got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "rfa_feature_map: the kernel takes fp32 or fp64 inputs (the accumulation dtype), got ", x.scalar_type());
  TORCH_CHECK(projection.dim() == 3 && projection.size(0) == x.size(2) && projection.size(2) == x.size(3),
              "rfa_feature_map: projection must be (H, D, d) = (", x.size(2), ", D, ", x.size(3), "), got ",
              projection.sizes());
  TORCH_CHECK(projection.scalar_type() == x.scalar_type(), "rfa_feature_map: projection dtype must match x");
  TORCH_CHECK(projection.device() == x.device(), "rfa_feature_map: projection must be on x's device");
  if (tau.has_value()) {
    TORCH_CHECK(tau->dim() == 1 && tau->size(0) == x.size(2), "rfa_feature_map: tau must be (H,) = (", x.size(2),
                ",), got ", tau->sizes());
    TORCH_CHECK(tau->scalar_type() == x.scalar_type(), "rfa_feature_map: tau dtype must match x");
    TORCH_CHECK(tau->device() == x.device(), "rfa_feature_map: tau must be on x's device");
  }
}

}  // namespace talk_hf
