// DropConnect on the normalised kernel taps of the dynamic / lightweight convolution (Wu et al., 2019: dropout on
// the softmax-normalised weights), drawn inside the kernels from a seed instead of read from a mask tensor, so that
// the forward and the backward agree without storing one (and without the slow per-element generator of
// torch.bernoulli_ on the CPU). Shared by the CPU and CUDA kernels; specification: `dropconnect_keep` in
// talk_hf/dynamic_conv.py, the same arithmetic in int64 PyTorch ops.
//
// Tap n (its flat index in the weight as the caller gave it: ((b*T + t)*H + h)*K + k, or h*K + k for one (H, K)
// LightConv kernel, which keeps one mask for every position) is kept when the top 24 bits of
// splitmix64(seed + (n + 1) * gamma) (Steele, Lea and Flood, 2014: the generator's n-th output from state `seed`)
// fall below ceil((1 - p) * 2^24); a kept tap is scaled by 1 / (1 - p), a dropped one is 0 (torch's dropout scaling).
#pragma once
#include <math.h>
#include <stdint.h>

#include "host_device.h"

namespace talk_hf {

constexpr uint64_t kSplitMixGamma = 0x9E3779B97F4A7C15ull;

TALK_HD uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One call's DropConnect: off when p = 0 (every factor 1).
template <typename acc_t>
struct DropConnect {
  uint64_t seed;
  int64_t threshold;  // taps whose 24-bit draw is below it are kept: ceil((1 - p) * 2^24), 2^24 when off
  acc_t scale;        // 1 / (1 - p) (0 for p = 1)
  bool on;

  // Whether tap n is kept (branch-free arithmetic: the CPU kernels vectorise loops of it).
  TALK_HD bool kept(int64_t n) const {
    const uint64_t draw = splitmix64_mix(seed + static_cast<uint64_t>(n + 1) * kSplitMixGamma) >> 40;
    return static_cast<int64_t>(draw) < threshold;
  }

  // The factor of tap n: scale when kept, else 0 (1 when off).
  TALK_HD acc_t factor(int64_t n) const {
    if (!on) return acc_t(1);
    return kept(n) ? scale : acc_t(0);
  }
};

// p in [0, 1]; seed: any 64 bits (the kernels read it from the caller's int64 tensor).
template <typename acc_t>
TALK_HD DropConnect<acc_t> make_dropconnect(double p, int64_t seed) {
  DropConnect<acc_t> dc;
  dc.seed = static_cast<uint64_t>(seed);
  dc.threshold = static_cast<int64_t>(ceil((1.0 - p) * 16777216.0));
  dc.scale = p < 1.0 ? static_cast<acc_t>(1.0 / (1.0 - p)) : acc_t(0);
  dc.on = p > 0.0;
  return dc;
}

}  // namespace talk_hf
