// Block programs of the CUDA causal-RFA kernels (csrc/cuda/rfa.cu): each kernel body is a function of a `Block`,
// which gives the thread's index and the block's size, a barrier (`sync`) and a block-wide sum (`reduce_sum`, which
// also synchronises). rfa.cu runs them with CudaBlock (threadIdx, __syncthreads, warp shuffles);
// tests/ops/cuda_tile_emulator.cpp runs the very same functions on the CPU with one fiber per thread, switching
// fibers at each barrier in thread order or in reverse (a missing barrier changes the result), with shared memory
// and workspace poisoned with NaN (reading what nobody wrote shows up).
//
// The algorithm and the checkpoint convention are those of csrc/cpu/rfa_cpu.cpp (specification: talk_hf/rfa.py,
// `rfa_causal_ref`):
//   P_t = decay[t-1] * P_{t-1} + k_t [v_t, 1]^T,  out_t = (q_t^T P_t)[:D] / max((q_t^T P_t)[D], eps),
//   final = decay[T-1] * P_{T-1},  checkpoints[n] = P_{n*chunk - 1} (the initial state for n = 0).
// Layouts: q, k (B, T, H, F); v, out (B, T, H, D); decay (B, T, H); states (B, H, F, E), E = D + 1, row-major
// (f, e). fp32 or fp64 throughout (the Python wrapper casts activations to the state dtype first).
//
// One block per (b, h) at a time, stepping through time; the (F, E) state lives in global memory (the final-state
// output in the forward, a workspace in the backward) and stays in L2. Within a step the block's threads split the
// state's entries (updates), its columns (q^T P, G^T k) or its rows (P g, G v); reductions are fixed-order, so
// results are deterministic.
//
// Backward, per (b, h), chunks in reverse: recompute the chunk's states from its checkpoint into the workspace,
// then for t from the chunk end down: g = d out / d (q^T P_t); G += q_t g^T (G = dL/dP_t);
// dq_t = P_t g; dk_t = G [v_t, 1]; dv_t = (G^T k_t)[:D]; ddecay[t-1] = <G, P_{t-1}>; G *= decay[t-1].
// Workspace: (B*H) x ((chunk + 1) states + 1 adjoint) x F x E accumulators.
#pragma once
#include <stdint.h>

#include "../rfa_math.h"

namespace talk_hf {
namespace rfa_blocks {

struct RfaDims {
  int64_t B, T, H, F, D, E, chunk, N;
};

template <typename acc_t>
struct RfaArgs {
  const acc_t* q;
  const acc_t* k;
  const acc_t* v;
  const acc_t* decay;         // or nullptr (no gate)
  const acc_t* init;          // forward: initial state or nullptr (zeros)
  acc_t eps;
  acc_t* out;                 // forward
  acc_t* state;               // forward: final state (B, H, F, E)
  acc_t* checkpoints;         // (B, H, N, F, E): written by the forward, read by the backward
  const acc_t* grad_out;      // backward
  const acc_t* grad_final;    // backward, or nullptr
  acc_t *grad_q, *grad_k, *grad_v;
  acc_t* grad_decay;          // or nullptr
  acc_t* grad_init;           // or nullptr
  acc_t* workspace;           // backward
  RfaDims d;
};

// Shared memory of a block, in accumulators: q, k (F each), [v, 1], q^T P, g (E each).
TALK_HD int64_t rfa_shared_elems(const RfaDims& d) { return 2 * d.F + 3 * d.E; }

template <typename acc_t>
struct RfaShared {
  acc_t *q, *k, *vv, *num, *g;
};

template <typename acc_t>
TALK_HD RfaShared<acc_t> shared_vectors(acc_t* smem, const RfaDims& d) {
  return {smem, smem + d.F, smem + 2 * d.F, smem + 2 * d.F + d.E, smem + 2 * d.F + 2 * d.E};
}

// Offset of row (b, t, h) of a (B, T, H, width) tensor.
TALK_HD int64_t bth(const RfaDims& d, int64_t b, int64_t t, int64_t h, int64_t width) {
  return ((b * d.T + t) * d.H + h) * width;
}

template <typename acc_t>
TALK_HD acc_t decay_at(const acc_t* decay, const RfaDims& d, int64_t b, int64_t t, int64_t h) {
  return decay ? decay[(b * d.T + t) * d.H + h] : acc_t(1);
}

// Stage q_t (if sq) / k_t (F), [v_t, 1] (E) of one step into shared memory. Caller synchronises.
template <typename acc_t, typename Block>
TALK_BLOCK void load_step(const Block& blk, const RfaArgs<acc_t>& a, int64_t b, int64_t t, int64_t h, acc_t* sq,
                          acc_t* sk, acc_t* svv) {
  const RfaDims& d = a.d;
  for (int64_t f = blk.tid(); f < d.F; f += blk.size()) {
    if (sq) sq[f] = a.q[bth(d, b, t, h, d.F) + f];
    sk[f] = a.k[bth(d, b, t, h, d.F) + f];
  }
  for (int64_t e = blk.tid(); e < d.E; e += blk.size()) svv[e] = e < d.D ? a.v[bth(d, b, t, h, d.D) + e] : acc_t(1);
}

// dst = scale * src + k vv^T over the thread's entries (dst may alias src: each entry is read, then written, by one
// thread).
template <typename acc_t, typename Block>
TALK_BLOCK void advance_state(const Block& blk, const acc_t* src, acc_t scale, const acc_t* sk, const acc_t* svv,
                              acc_t* dst, const RfaDims& d) {
  for (int64_t i = blk.tid(); i < d.F * d.E; i += blk.size()) dst[i] = scale * src[i] + sk[i / d.E] * svv[i % d.E];
}

// num[e] = sum_f q[f] P[f, e], one column per thread.
template <typename acc_t, typename Block>
TALK_BLOCK void read_state(const Block& blk, const acc_t* P, const acc_t* sq, acc_t* num, const RfaDims& d) {
  for (int64_t e = blk.tid(); e < d.E; e += blk.size()) {
    acc_t sum = 0;
    for (int64_t f = 0; f < d.F; ++f) sum += sq[f] * P[f * d.E + e];
    num[e] = sum;
  }
}

// The forward kernel's body for block `block` of `grid`: (b, h) = block, block + grid, ...
template <typename acc_t, typename Block>
TALK_BLOCK void rfa_fwd_block(Block& blk, const RfaArgs<acc_t>& a, int64_t block, int64_t grid, acc_t* smem) {
  const RfaDims& d = a.d;
  [[maybe_unused]] const auto [sq, sk, svv, num, g] = shared_vectors(smem, d);
  const int64_t S = d.F * d.E;
  for (int64_t bh = block; bh < d.B * d.H; bh += grid) {
    const int64_t b = bh / d.H, h = bh % d.H;
    acc_t* P = a.state + bh * S;
    for (int64_t i = blk.tid(); i < S; i += blk.size()) P[i] = a.init ? a.init[bh * S + i] : acc_t(0);
    acc_t scale = 1;
    for (int64_t t = 0; t < d.T; ++t) {
      if (d.chunk > 0 && t % d.chunk == 0) {  // same thread-to-entry mapping as advance_state: no barrier needed
        acc_t* ck = a.checkpoints + (bh * d.N + t / d.chunk) * S;
        for (int64_t i = blk.tid(); i < S; i += blk.size()) ck[i] = P[i];
      }
      load_step(blk, a, b, t, h, sq, sk, svv);
      blk.sync();
      advance_state(blk, P, scale, sk, svv, P, d);
      blk.sync();
      read_state(blk, P, sq, num, d);
      blk.sync();
      const acc_t den = num[d.D] > a.eps ? num[d.D] : a.eps;
      for (int64_t e = blk.tid(); e < d.D; e += blk.size()) a.out[bth(d, b, t, h, d.D) + e] = num[e] / den;
      scale = decay_at(a.decay, d, b, t, h);
      blk.sync();  // shared vectors are reloaded next step
    }
    for (int64_t i = blk.tid(); i < S; i += blk.size()) P[i] *= scale;
    blk.sync();
  }
}

// The backward kernel's body for block `block` of `grid` (checkpoints every d.chunk >= 1 steps, T >= 1).
template <typename acc_t, typename Block>
TALK_BLOCK void rfa_bwd_block(Block& blk, const RfaArgs<acc_t>& a, int64_t block, int64_t grid, acc_t* smem) {
  const RfaDims& d = a.d;
  const auto [sq, sk, svv, num, g] = shared_vectors(smem, d);
  const int64_t S = d.F * d.E;
  for (int64_t bh = block; bh < d.B * d.H; bh += grid) {
    const int64_t b = bh / d.H, h = bh % d.H;
    acc_t* states = a.workspace + bh * (d.chunk + 2) * S;  // states[0] = P_{t0-1}, states[i + 1] = P_{t0+i}
    acc_t* G = states + (d.chunk + 1) * S;
    for (int64_t i = blk.tid(); i < S; i += blk.size()) G[i] = 0;
    for (int64_t n = d.N - 1; n >= 0; --n) {
      const int64_t t0 = n * d.chunk, t1 = t0 + d.chunk < d.T ? t0 + d.chunk : d.T;
      const acc_t* ck = a.checkpoints + (bh * d.N + n) * S;
      for (int64_t i = blk.tid(); i < S; i += blk.size()) states[i] = ck[i];
      for (int64_t t = t0; t < t1; ++t) {
        load_step<acc_t>(blk, a, b, t, h, nullptr, sk, svv);
        blk.sync();
        advance_state(blk, states + (t - t0) * S, t > 0 ? decay_at(a.decay, d, b, t - 1, h) : acc_t(1), sk, svv,
                      states + (t - t0 + 1) * S, d);
        blk.sync();
      }
      for (int64_t t = t1 - 1; t >= t0; --t) {
        const acc_t* P = states + (t - t0 + 1) * S;
        const acc_t* prev = P - S;
        if (t == d.T - 1) {  // final = decay[T-1] * P_{T-1}
          acc_t dot = 0;
          const acc_t scale = decay_at(a.decay, d, b, t, h);
          for (int64_t i = blk.tid(); i < S; i += blk.size()) {
            const acc_t gf = a.grad_final ? a.grad_final[bh * S + i] : acc_t(0);
            dot += gf * P[i];
            G[i] = scale * gf;
          }
          dot = blk.reduce_sum(dot);
          if (a.grad_decay && blk.tid() == 0) a.grad_decay[(b * d.T + t) * d.H + h] = dot;
        }
        load_step(blk, a, b, t, h, sq, sk, svv);
        blk.sync();
        read_state(blk, P, sq, num, d);
        blk.sync();
        if (blk.tid() == 0) rfa_normalise_backward(num, a.grad_out + bth(d, b, t, h, d.D), a.eps, g, d.D);
        blk.sync();
        for (int64_t i = blk.tid(); i < S; i += blk.size()) G[i] += sq[i / d.E] * g[i % d.E];
        blk.sync();
        for (int64_t f = blk.tid(); f < d.F; f += blk.size()) {
          acc_t dq = 0, dk = 0;
          for (int64_t e = 0; e < d.E; ++e) {
            dq += P[f * d.E + e] * g[e];
            dk += G[f * d.E + e] * svv[e];
          }
          a.grad_q[bth(d, b, t, h, d.F) + f] = dq;
          a.grad_k[bth(d, b, t, h, d.F) + f] = dk;
        }
        for (int64_t e = blk.tid(); e < d.D; e += blk.size()) {
          acc_t dv = 0;
          for (int64_t f = 0; f < d.F; ++f) dv += G[f * d.E + e] * sk[f];
          a.grad_v[bth(d, b, t, h, d.D) + e] = dv;
        }
        if (t > 0) {
          acc_t dot = 0;
          for (int64_t i = blk.tid(); i < S; i += blk.size()) dot += G[i] * prev[i];
          dot = blk.reduce_sum(dot);  // synchronises: G is no longer read after this
          if (a.grad_decay && blk.tid() == 0) a.grad_decay[(b * d.T + t - 1) * d.H + h] = dot;
          const acc_t scale = decay_at(a.decay, d, b, t - 1, h);
          for (int64_t i = blk.tid(); i < S; i += blk.size()) G[i] *= scale;
        }
        blk.sync();
      }
    }
    if (a.grad_init)
      for (int64_t i = blk.tid(); i < S; i += blk.size()) a.grad_init[bh * S + i] = G[i];
    blk.sync();
  }
}

}  // namespace rfa_blocks
}  // namespace talk_hf
