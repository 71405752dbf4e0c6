// Operator schemas of the talk_hf extension. Implementations: csrc/cpu/*.cpp (CPU) and csrc/cuda/bindings.cpp
// (CUDA). Autograd and fake (meta) kernels are registered in Python, in talk_hf/_kernels.py.
#include <Python.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/library.h>

extern "C" {
// `import talk_hf._C` loads this library, which runs the static registrations below.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

// rfa_causal_fwd saves the state before every `chunk` steps for rfa_causal_bwd (checkpoints, (B, H, N, F, D + 1));
// chunk 0 saves none (N = 0), for calls that need no backward. tf32: the CUDA kernels may do their matrix products
// on tensor cores with TF32 operands (fp32 accumulation; fp32 tensors, sm_80 and newer); ignored on CPU.
TORCH_LIBRARY(talk_hf, m) {
  m.def("talk_conv_fwd(Tensor x, Tensor offset_left, Tensor? offset_right, int max_left, int max_right) -> Tensor");
  m.def(
      "talk_conv_bwd(Tensor grad_out, Tensor x, Tensor offset_left, Tensor? offset_right, int max_left, "
      "int max_right) -> (Tensor, Tensor, Tensor)");
  // Decoding step(s) from the fixed-size state (B, max_left + 2, C) -> (out, new state); no autograd (inference).
  m.def("talk_conv_step(Tensor x, Tensor offset_left, Tensor state, int max_left) -> (Tensor, Tensor)");
  m.def(
      "rfa_causal_fwd(Tensor q, Tensor k, Tensor v, Tensor? decay, Tensor? initial_state, float eps, int chunk, "
      "bool tf32=False) -> (Tensor, Tensor, Tensor)");
  m.def(
      "rfa_causal_bwd(Tensor grad_out, Tensor? grad_state, Tensor q, Tensor k, Tensor v, Tensor? decay, "
      "Tensor? initial_state, Tensor checkpoints, float eps, int chunk, bool tf32=False) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  // Decoding step(s) of rfa_causal that advance `state` (B, H, F, D + 1), the initial state, in place -> out; no
  // checkpoints, no autograd (inference).
  m.def("rfa_causal_step_(Tensor q, Tensor k, Tensor v, Tensor? decay, Tensor(a!) state, float eps) -> Tensor");
  // softmax: weight holds logits, normalised over K inside the kernels (grad_weight is then the logits' gradient).
  // weight_dropout > 0: DropConnect on the normalised taps, the mask drawn from `seed` (a one-element int64 tensor
  // on x's device; csrc/dropconnect.h), the same in the forward and the backward.
  m.def(
      "dynamic_conv_fwd(Tensor x, Tensor weight, int padding_left, bool softmax=False, Tensor? seed=None, "
      "float weight_dropout=0.0) -> Tensor");
  m.def(
      "dynamic_conv_bwd(Tensor grad_out, Tensor x, Tensor weight, int padding_left, bool softmax=False, "
      "Tensor? seed=None, float weight_dropout=0.0) -> (Tensor, Tensor)");
  // Causal decoding step(s) from the last K - 1 inputs -> (out, new state); no autograd (inference).
  m.def("dynamic_conv_step(Tensor x, Tensor weight, Tensor state, bool softmax=False) -> (Tensor, Tensor)");
  // Random features (B, T, H, 2D) of x (B, T, H, d) with projections (H, D, d) and temperatures (H,); no autograd
  // (decoding and inference: the models' training path is the PyTorch form).
  m.def("rfa_feature_map(Tensor x, Tensor projection, Tensor? tau) -> Tensor");
}

// rfa_causal_step_ writes `state` (argument 4) through its data pointer. Its ADInplaceOrView kernel does what PyTorch's
// in-place ops do at that key: bump the state's version counter (a backward that saved the state then refuses instead
// of reading the new values), which refuses an inference tensor outside inference mode, before anything is written.
// (PyTorch's own fallback for this key bumps mutable outputs only; the state is not returned.)
namespace {
void rfa_causal_step_inplace(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
  const auto arguments = op.schema().arguments().size();
  torch::autograd::increment_version((*stack)[stack->size() - arguments + 4].toTensor());
  at::AutoDispatchBelowADInplaceOrView guard;
  op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
}
}  // namespace

TORCH_LIBRARY_IMPL(talk_hf, ADInplaceOrView, m) {
  m.impl("rfa_causal_step_", torch::CppFunction::makeFromBoxedFunction<&rfa_causal_step_inplace>());
}
