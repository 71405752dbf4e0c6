// Arithmetic of the causal RFA kernels shared by the CPU and CUDA implementations (no torch headers).
// Specification: talk_hf/rfa.py (`rfa_causal_ref`).
#pragma once
#include <stdint.h>

#include "host_device.h"

namespace talk_hf {

// Number of states the forward saves for the backward: one per `chunk` steps; chunk 0 saves none (inference).
TALK_HD int64_t rfa_num_chunks(int64_t seqlen, int64_t chunk) { return chunk > 0 ? cdiv(seqlen, chunk) : 0; }

// Gradient g (D + 1 entries) of out = num[:D] / max(num[D], eps) w.r.t. num, given d out = go (D entries).
// clamp_min passes the gradient where num[D] >= eps, as torch does; below eps the normaliser gets none.
template <typename acc_t>
TALK_HD void rfa_normalise_backward(const acc_t* num, const acc_t* go, acc_t eps, acc_t* g, int64_t D) {
  const bool clamped = num[D] < eps;
  const acc_t den = clamped ? eps : num[D];
  acc_t dot = 0;
  for (int64_t e = 0; e < D; ++e) {
    g[e] = go[e] / den;
    dot += go[e] * num[e];
  }
  g[D] = clamped ? acc_t(0) : -dot / (den * den);
}

}  // namespace talk_hf
