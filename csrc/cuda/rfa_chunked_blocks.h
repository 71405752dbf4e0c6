// Chunked block programs of the CUDA causal-RFA kernels (csrc/cuda/rfa.cu runs them for T > 1 when their shared
// memory fits the device, the per-step programs of rfa_blocks.h otherwise). Same Block interface, arguments
// (RfaArgs), layouts and checkpoint convention as rfa_blocks.h; specification: talk_hf/rfa.py (`rfa_causal_ref`).
//
// One block per (b, h) (grid-stride), chunks of L steps (L = the op's chunk, 64 when it is 0). A chunk's rows of
// Q, K (len, F) and W = [V, 1] (len, E), the (F, E) state U = P_{t0-1} entering it (its checkpoint: not yet decayed
// by decay[t0-1]) and len x len score tiles sit in shared memory. Decays enter only through log-decay prefix sums,
// shifted by one step so that the carried state is the checkpoint:
//   lg_i = log max(decay[t0 + i - 1], tiny)  (0 at t = -1),  C_i = lg_0 + ... + lg_i,  C_end = C_{len-1},
//   M_ij = exp(C_i - C_j) for j <= i, else 0,   alpha_j = exp(C_end - C_j),
//   P_{t0+i} = exp(C_i) U + sum_{j <= i} M_ij k_j w_j^T:
//   num = exp(C) * (Q U) + (M * Q K^T) W,  out = num[:, :D] / max(num[:, D], eps),
//   U <- exp(C_end) U + (alpha * K)^T W,   and final = decay[T-1] U after the last chunk.
// Backward, chunks in reverse, carrying dU = dL/dU (the state after the chunk). The last chunk takes the final
// state's decay as one more step (C_end = C_{len-1} + lg(decay[T-1])) and starts from dU = d final. With G the
// gradients of num (rfa_normalise_backward per row), R = G W^T and A = (Q K^T) * R:
//   dQ = exp(C) * (G U^T) + (M * R) K,   dK = alpha * (W dU^T) + (M * R)^T Q,
//   dW = alpha * (K dU) + (M * Q K^T)^T G  (dV = its first D columns),
//   dU <- exp(C_end) dU + (exp(C) * Q)^T G  (after chunk 0: the initial state's gradient),
//   d decay[t0 + i - 1] = <dL/dP_{t0+i}, P_{t0+i-1}>
//     = sum_{m >= i} M_mi (B_{m,i-1} + beta_i y_m) + alpha_i (c_{i-1} + beta_i <dU, U>),
// with B = A M^T, y_m = (q_m^T U) g_m, x_j = k_j^T dU w_j, c = M x, beta_i = exp(C_{i-1}) (1, B_{m,-1} = c_{-1} = 0
// for i = 0), and i = len (alpha = 1, no m terms) for decay[T-1] in the last chunk. No decay is ever divided by.
//
// Products run over shared-memory tiles (csrc/cuda/tile_products.h), of the kind `Tile` the programs are
// instantiated with: SIMT micro-tiles (products exact in the accumulation type), or for fp32 tensor-core warp tiles
// (TF32 operands, fp32 accumulation; rfa.cu picks them when the op's `tf32` is set). Shared tiles take the row
// strides of that kind, and a block is the same whole warps for both. Every shared word a phase writes is written
// by one thread and read by no other thread in that phase.
#pragma once
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "../acc_cast.h"
#include "rfa_blocks.h"
#include "tile_products.h"

namespace talk_hf {
namespace rfa_chunked {

using rfa_blocks::bth;
using rfa_blocks::decay_at;
using rfa_blocks::RfaArgs;
using rfa_blocks::RfaDims;
using products::accumulate;
using products::for_each_entry;
using products::for_each_tile;
using products::kMicro;
using products::MicroTile;
using products::Operand;
using products::WarpTile;

constexpr int64_t kDefaultChunk = 64;  // L when the op saves no checkpoints (chunk 0)
constexpr int kMaxThreads = 320;       // block size cap (the kernels' launch bound; 288 for F = D = L = 64)

// log max(decay, tiny): a zero decay becomes exp(log tiny) ~ tiny, never a division.
TALK_HD float log_decay(float v) { return logf(v > FLT_MIN ? v : FLT_MIN); }
TALK_HD double log_decay(double v) { return log(v > DBL_MIN ? v : DBL_MIN); }

// ------------------------------------------------------------------------------------------------ shapes

// Chunk length and the row strides of the shared tiles (those of Tile's loads): (., F), (., E) and (., L) rows.
struct Sizes {
  int64_t L, ldF, ldE, ldL;
};

TALK_HD int64_t chunk_length(const RfaDims& d) { return d.chunk > 0 ? d.chunk : kDefaultChunk; }

template <typename Tile>
TALK_HD Sizes sizes(const RfaDims& d) {
  const int64_t L = chunk_length(d);
  return {L, Tile::stride(d.F), Tile::stride(d.E), Tile::stride(L)};
}

// Chunk n of (b, h) = bh: steps t0 .. t0 + len - 1.
struct Chunk {
  int64_t b, h, t0, len;
};

TALK_HD Chunk chunk_at(const RfaDims& d, const Sizes& z, int64_t bh, int64_t n) {
  const int64_t t0 = n * z.L;
  return {bh / d.H, bh % d.H, t0, min64(z.L, d.T - t0)};
}

// Micro-tiles of an m x n product.
TALK_HD int64_t micro_tiles(int64_t m, int64_t n) { return cdiv(m, kMicro) * cdiv(n, kMicro); }

// Threads of a block: one SIMT micro-tile of every product each ((L, L), (L, E), (L, F), (F, E)), in whole warps,
// at most kMaxThreads (larger products loop); warp tiles run on the same block (at F = D = L = 64, 9 warps for 32-36
// warp tiles a product). Used by the launcher; the emulator may run any count (whole warps for warp tiles).
TALK_HD int64_t chunked_threads(const RfaDims& d) {
  const int64_t L = chunk_length(d);
  const int64_t tiles = max64(micro_tiles(L, max64(L, max64(d.E, d.F))), micro_tiles(d.F, d.E));
  return min64(kMaxThreads, cdiv(tiles, 32) * 32);
}

// Consecutive buffers from `next`, a pointer or an offset: take(n) hands out the next n accumulators.
template <typename P>
struct Carve {
  P next;
  TALK_HD P take(int64_t n) {
    const P at = next;
    next = next + n;
    return at;
  }
};

// Shared buffers of the forward. P = acc_t* gives the buffers from the base of shared memory; P = int64_t gives
// their offsets from 0, and `end` the number of accumulators to allocate (one layout for both).
template <typename P>
struct FwdBuffers {
  P q, k;            // (L, ldF): the chunk's queries; keys, scaled by alpha once the scores are formed
  P w, num;          // (L, ldE): [v, 1]; q^T P per step (its inter-chunk part Q U first)
  P state;           // (F, ldE): U
  P scores;          // (L, ldL): Q K^T, then M * Q K^T
  P logs, prefix;    // (L + 1): lg, C
  P end;
};

template <typename Tile, typename P>
TALK_HD FwdBuffers<P> fwd_buffers(P base, const RfaDims& d) {
  const Sizes z = sizes<Tile>(d);
  Carve<P> c{base};
  FwdBuffers<P> s;
  s.q = c.take(z.L * z.ldF);
  s.k = c.take(z.L * z.ldF);
  s.w = c.take(z.L * z.ldE);
  s.num = c.take(z.L * z.ldE);
  s.state = c.take(d.F * z.ldE);
  s.scores = c.take(z.L * z.ldL);
  s.logs = c.take(z.L + 1);
  s.prefix = c.take(z.L + 1);
  s.end = c.next;
  return s;
}

// Shared buffers of the backward (as FwdBuffers).
template <typename P>
struct BwdBuffers {
  P q, k;                        // (L, ldF)
  P w, qu, num, g;               // (L, ldE): [v, 1]; Q U; num, then dW's x_j terms; G, then exp(C) * G
  P state, dstate;               // (F, ldE): U (the checkpoint), dU
  P pairs, mask, scores;         // (L, ldL): Q K^T then A; M; M * Q K^T then B
  P grad_out, gscores;           // one (L, max(ldL, D)) buffer: the chunk's grad_out rows (L, D) until G is formed,
                                 // then M * R (L, ldL)
  P logs, prefix;                // (L + 1): lg, C
  P x, y, c;                     // (L): x, y, c = M x
  P end;
};

template <typename Tile, typename P>
TALK_HD BwdBuffers<P> bwd_buffers(P base, const RfaDims& d) {
  const Sizes z = sizes<Tile>(d);
  Carve<P> c{base};
  BwdBuffers<P> s;
  s.q = c.take(z.L * z.ldF);
  s.k = c.take(z.L * z.ldF);
  s.w = c.take(z.L * z.ldE);
  s.qu = c.take(z.L * z.ldE);
  s.num = c.take(z.L * z.ldE);
  s.g = c.take(z.L * z.ldE);
  s.state = c.take(d.F * z.ldE);
  s.dstate = c.take(d.F * z.ldE);
  s.pairs = c.take(z.L * z.ldL);
  s.mask = c.take(z.L * z.ldL);
  s.scores = c.take(z.L * z.ldL);
  s.grad_out = s.gscores = c.take(z.L * max64(z.ldL, d.D));
  s.logs = c.take(z.L + 1);
  s.prefix = c.take(z.L + 1);
  s.x = c.take(z.L);
  s.y = c.take(z.L);
  s.c = c.take(z.L);
  s.end = c.next;
  return s;
}

// Accumulators of the forward's or the backward's buffers (the block-reduction scratch follows them).
template <typename Tile>
TALK_HD int64_t shared_elems(const RfaDims& d, bool backward) {
  return backward ? bwd_buffers<Tile, int64_t>(0, d).end : fwd_buffers<Tile, int64_t>(0, d).end;
}

// Bytes of dynamic shared memory a block needs: its buffers, then one accumulator per warp (the scratch of the
// block reduction). rfa.cu launches with this (or falls back to the per-step kernels when the device cannot give
// it); the emulator allocates it.
template <typename Tile>
TALK_HD int64_t shared_bytes(const RfaDims& d, int64_t acc_bytes, bool backward) {
  return (shared_elems<Tile>(d, backward) + chunked_threads(d) / 32) * acc_bytes;
}

// The same for the tile kind a launch picks at run time (SIMT strides do not depend on the accumulation type).
TALK_HD int64_t shared_bytes(const RfaDims& d, int64_t acc_bytes, bool backward, bool tensor_cores) {
  return tensor_cores ? shared_bytes<WarpTile>(d, acc_bytes, backward)
                      : shared_bytes<MicroTile<float>>(d, acc_bytes, backward);
}

// ------------------------------------------------------------------------------------------------ chunk phases

// A (F, E) state between global memory (contiguous) and shared memory (row stride ldE): dst = src, or zeros when
// src is nullptr.
template <typename acc_t, typename Block>
TALK_BLOCK void state_to_shared(const Block& blk, const acc_t* src, acc_t* dst, const RfaDims& d, const Sizes& z) {
  for (int64_t i = blk.tid(); i < d.F * d.E; i += blk.size()) dst[i / d.E * z.ldE + i % d.E] = src ? src[i] : acc_t(0);
}

// dst = scale * src, a shared state to global memory.
template <typename acc_t, typename Block>
TALK_BLOCK void state_to_global(const Block& blk, const acc_t* src, acc_t scale, acc_t* dst, const RfaDims& d,
                                const Sizes& z) {
  for (int64_t i = blk.tid(); i < d.F * d.E; i += blk.size()) dst[i] = scale * src[i / d.E * z.ldE + i % d.E];
}

// The chunk's rows of q, k (len x F) and w = [v, 1] (len x E), and the shifted log decays: logs[i] =
// lg(decay[t0 + i - 1]) for i < len (0 before the first step); logs[len] = lg(decay[T-1]) when `final_step` (the
// backward's last chunk takes the final state's decay as one more step), else 0.
template <typename acc_t, typename Block>
TALK_BLOCK void load_chunk(const Block& blk, const RfaArgs<acc_t>& a, const Chunk& c, const Sizes& z, acc_t* q,
                           acc_t* k, acc_t* w, acc_t* logs, bool final_step) {
  const RfaDims& d = a.d;
  for (int64_t idx = blk.tid(); idx < c.len * d.F; idx += blk.size()) {
    const int64_t i = idx / d.F, f = idx % d.F, at = bth(d, c.b, c.t0 + i, c.h, d.F) + f;
    q[i * z.ldF + f] = a.q[at];
    k[i * z.ldF + f] = a.k[at];
  }
  for (int64_t idx = blk.tid(); idx < c.len * d.E; idx += blk.size()) {
    const int64_t i = idx / d.E, e = idx % d.E;
    w[i * z.ldE + e] = e < d.D ? a.v[bth(d, c.b, c.t0 + i, c.h, d.D) + e] : acc_t(1);
  }
  for (int64_t i = blk.tid(); i <= c.len; i += blk.size()) {
    const int64_t t = i < c.len ? c.t0 + i - 1 : (final_step ? d.T - 1 : -1);
    logs[i] = t >= 0 ? log_decay(decay_at(a.decay, d, c.b, t, c.h)) : acc_t(0);
  }
}

// prefix[i] = C_i = logs[0] + ... + logs[i] for i <= len (prefix[len] = C_end): one thread per entry, each summed
// in the same order, so C_i - C_j is the same number wherever it is formed.
template <typename acc_t, typename Block>
TALK_BLOCK void prefix_sums(const Block& blk, const acc_t* logs, int64_t len, acc_t* prefix) {
  for (int64_t i = blk.tid(); i <= len; i += blk.size()) {
    acc_t sum = 0;
    for (int64_t m = 0; m <= i; ++m) sum += logs[m];
    prefix[i] = sum;
  }
}

// pairs = Q K^T (len x len, raw).
template <typename Tile, typename acc_t, typename Block>
TALK_BLOCK void query_key_products(const Block& blk, const acc_t* q, const acc_t* k, int64_t len, const RfaDims& d,
                                   const Sizes& z, acc_t* pairs) {
  for_each_tile<Tile>(blk, len, len, [&](Tile& t) {
    accumulate(blk, t, d.F, Operand<acc_t>{q, z.ldF, 1}, Operand<acc_t>{k, z.ldF, 1});
    for_each_entry(t, [&](int64_t i, int64_t j, acc_t v) { pairs[i * z.ldL + j] = v; });
  });
}

// qu = Q U (len x E): the queries against the entering state, before its decay.
template <typename Tile, typename acc_t, typename Block>
TALK_BLOCK void queries_times_state(const Block& blk, const acc_t* q, const acc_t* state, int64_t len,
                                    const RfaDims& d, const Sizes& z, acc_t* qu) {
  for_each_tile<Tile>(blk, len, d.E, [&](Tile& t) {
    accumulate(blk, t, d.F, Operand<acc_t>{q, z.ldF, 1}, Operand<acc_t>{state, 1, z.ldE});
    for_each_entry(t, [&](int64_t i, int64_t e, acc_t v) { qu[i * z.ldE + e] = v; });
  });
}

// scores = M * pairs (len x len; scores may be pairs), and mask = M unless nullptr.
template <typename acc_t, typename Block>
TALK_BLOCK void decay_scores(const Block& blk, const acc_t* prefix, int64_t len, const Sizes& z, const acc_t* pairs,
                             acc_t* scores, acc_t* mask) {
  for (int64_t idx = blk.tid(); idx < len * len; idx += blk.size()) {
    const int64_t i = idx / len, j = idx % len, at = i * z.ldL + j;
    const acc_t m = j <= i ? acc_exp(prefix[i] - prefix[j]) : acc_t(0);
    if (mask) mask[at] = m;
    scores[at] = m * pairs[at];
  }
}

// num = exp(C) * qu + scores W (len x E): q^T P per step (num may be qu: each entry is read, then written, by its
// owner).
template <typename Tile, typename acc_t, typename Block>
TALK_BLOCK void numerators(const Block& blk, const acc_t* scores, const acc_t* w, const acc_t* qu,
                           const acc_t* prefix, int64_t len, const RfaDims& d, const Sizes& z, acc_t* num) {
  for_each_tile<Tile>(blk, len, d.E, [&](Tile& t) {
    accumulate(blk, t, len, Operand<acc_t>{scores, z.ldL, 1}, Operand<acc_t>{w, 1, z.ldE});
    for_each_entry(t, [&](int64_t i, int64_t e, acc_t v) {
      num[i * z.ldE + e] = acc_exp(prefix[i]) * qu[i * z.ldE + e] + v;
    });
  });
}

// ------------------------------------------------------------------------------------------------ forward

// k_j *= alpha_j (len x F): the keys' weights in the state at the chunk end (the forward needs K for nothing else).
template <typename acc_t, typename Block>
TALK_BLOCK void keys_to_chunk_end(const Block& blk, const acc_t* prefix, int64_t len, const RfaDims& d,
                                  const Sizes& z, acc_t* k) {
  for (int64_t idx = blk.tid(); idx < len * d.F; idx += blk.size()) {
    const int64_t j = idx / d.F;
    k[j * z.ldF + idx % d.F] *= acc_exp(prefix[len] - prefix[j]);
  }
}

// out rows t0 .. t0 + len - 1 = num[:, :D] / max(num[:, D], eps).
template <typename acc_t, typename Block>
TALK_BLOCK void write_outputs(const Block& blk, const RfaArgs<acc_t>& a, const Chunk& c, const Sizes& z,
                              const acc_t* num) {
  const RfaDims& d = a.d;
  for (int64_t idx = blk.tid(); idx < c.len * d.D; idx += blk.size()) {
    const int64_t i = idx / d.D, e = idx % d.D;
    const acc_t den = num[i * z.ldE + d.D];
    a.out[bth(d, c.b, c.t0 + i, c.h, d.D) + e] = num[i * z.ldE + e] / (den > a.eps ? den : a.eps);
  }
}

// U = exp(C_end) U + K^T W (F x E), K already scaled by alpha.
template <typename Tile, typename acc_t, typename Block>
TALK_BLOCK void advance_state(const Block& blk, const acc_t* k, const acc_t* w, const acc_t* prefix, int64_t len,
                              const RfaDims& d, const Sizes& z, acc_t* state) {
  const acc_t keep = acc_exp(prefix[len]);
  for_each_tile<Tile>(blk, d.F, d.E, [&](Tile& t) {
    accumulate(blk, t, len, Operand<acc_t>{k, 1, z.ldF}, Operand<acc_t>{w, 1, z.ldE});
    for_each_entry(t, [&](int64_t f, int64_t e, acc_t v) { state[f * z.ldE + e] = keep * state[f * z.ldE + e] + v; });
  });
}

// The forward kernel's body for block `block` of `grid`: (b, h) = block, block + grid, ...; five barriers per chunk.
template <typename Tile, typename acc_t, typename Block>
TALK_BLOCK void rfa_chunked_fwd_block(Block& blk, const RfaArgs<acc_t>& a, int64_t block, int64_t grid,
                                      acc_t* smem) {
  const RfaDims& d = a.d;
  const Sizes z = sizes<Tile>(d);
  const FwdBuffers<acc_t*> s = fwd_buffers<Tile>(smem, d);
  const int64_t S = d.F * d.E, N = cdiv(d.T, z.L);
  for (int64_t bh = block; bh < d.B * d.H; bh += grid) {
    state_to_shared(blk, a.init ? a.init + bh * S : nullptr, s.state, d, z);
    blk.sync();
    for (int64_t n = 0; n < N; ++n) {
      const Chunk c = chunk_at(d, z, bh, n);
      if (d.chunk > 0) state_to_global(blk, s.state, acc_t(1), a.checkpoints + (bh * d.N + n) * S, d, z);
      load_chunk(blk, a, c, z, s.q, s.k, s.w, s.logs, false);
      blk.sync();
      prefix_sums(blk, s.logs, c.len, s.prefix);
      query_key_products<Tile>(blk, s.q, s.k, c.len, d, z, s.scores);
      queries_times_state<Tile>(blk, s.q, s.state, c.len, d, z, s.num);
      blk.sync();
      decay_scores<acc_t>(blk, s.prefix, c.len, z, s.scores, s.scores, nullptr);
      keys_to_chunk_end(blk, s.prefix, c.len, d, z, s.k);
      blk.sync();
      numerators<Tile>(blk, s.scores, s.w, s.num, s.prefix, c.len, d, z, s.num);
      blk.sync();
      write_outputs(blk, a, c, z, s.num);
      advance_state<Tile>(blk, s.k, s.w, s.prefix, c.len, d, z, s.state);
      blk.sync();
    }
    const acc_t last = d.T > 0 ? decay_at(a.decay, d, bh / d.H, d.T - 1, bh % d.H) : acc_t(1);
    state_to_global(blk, s.state, last, a.state + bh * S, d, z);
    blk.sync();
  }
}

// ------------------------------------------------------------------------------------------------ backward

// The chunk's grad_out rows (len x D, row stride D) into shared memory, so that the rows' loops below read no
// global memory.
template <typename acc_t, typename Block>
TALK_BLOCK void load_grad_out(const Block& blk, const RfaArgs<acc_t>& a, const Chunk& c, acc_t* grad_out) {
  const RfaDims& d = a.d;
  for (int64_t idx = blk.tid(); idx < c.len * d.D; idx += blk.size())
    grad_out[idx] = a.grad_out[bth(d, c.b, c.t0 + idx / d.D, c.h, d.D) + idx % d.D];
}

// One thread per row i < len: g_i = d out_i / d num_i (rfa_normalise_backward) and y_i = (q_i^T U) g_i.
template <typename acc_t, typename Block>
TALK_BLOCK void num_gradients(const Block& blk, const RfaArgs<acc_t>& a, const Chunk& c, const Sizes& z,
                              const BwdBuffers<acc_t*>& s) {
  const RfaDims& d = a.d;
  for (int64_t i = blk.tid(); i < c.len; i += blk.size()) {
    acc_t* g = s.g + i * z.ldE;
    rfa_normalise_backward(s.num + i * z.ldE, s.grad_out + i * d.D, a.eps, g, d.D);
    acc_t y = 0;
    for (int64_t e = 0; e < d.E; ++e) y += s.qu[i * z.ldE + e] * g[e];
    s.y[i] = y;
  }
}

// R = G W^T (len x len): gscores = M * R, and pairs *= R (A = Q K^T * R, for the decay gradients).
template <typename Tile, typename acc_t, typename Block>
TALK_BLOCK void value_products(const Block& blk, int64_t len, const RfaDims& d, const Sizes& z,
                               const BwdBuffers<acc_t*>& s) {
  for_each_tile<Tile>(blk, len, len, [&](Tile& t) {
    accumulate(blk, t, d.E, Operand<acc_t>{s.g, z.ldE, 1}, Operand<acc_t>{s.w, z.ldE, 1});
    for_each_entry(t, [&](int64_t m, int64_t j, acc_t r) {
      s.gscores[m * z.ldL + j] = s.mask[m * z.ldL + j] * r;
      s.pairs[m * z.ldL + j] *= r;
    });
  });
}

// dq = exp(C) * (G U^T) + (M * R) K (len x F) -> grad_q rows.
template <typename Tile, typename acc_t, typename Block>
TALK_BLOCK void query_gradients(const Block& blk, const RfaArgs<acc_t>& a, const Chunk& c, const Sizes& z,
                                const BwdBuffers<acc_t*>& s) {
  const RfaDims& d = a.d;
  for_each_tile<Tile>(blk, c.len, d.F, [&](Tile& t) {
    accumulate(blk, t, d.E, Operand<acc_t>{s.g, z.ldE, 1}, Operand<acc_t>{s.state, z.ldE, 1});
    for_each_entry(t, [&](int64_t i, int64_t, acc_t& v) { v *= acc_exp(s.prefix[i]); });
    accumulate(blk, t, c.len, Operand<acc_t>{s.gscores, z.ldL, 1}, Operand<acc_t>{s.k, 1, z.ldF});
    for_each_entry(t, [&](int64_t i, int64_t f, acc_t v) { a.grad_q[bth(d, c.b, c.t0 + i, c.h, d.F) + f] = v; });
  });
}

// dk = alpha * (W dU^T) + (M * R)^T Q (len x F) -> grad_k rows.
template <typename Tile, typename acc_t, typename Block>
TALK_BLOCK void key_gradients(const Block& blk, const RfaArgs<acc_t>& a, const Chunk& c, const Sizes& z,
                              const BwdBuffers<acc_t*>& s) {
  const RfaDims& d = a.d;
  for_each_tile<Tile>(blk, c.len, d.F, [&](Tile& t) {
    accumulate(blk, t, d.E, Operand<acc_t>{s.w, z.ldE, 1}, Operand<acc_t>{s.dstate, z.ldE, 1});
    for_each_entry(t, [&](int64_t j, int64_t, acc_t& v) { v *= acc_exp(s.prefix[c.len] - s.prefix[j]); });
    accumulate(blk, t, c.len, Operand<acc_t>{s.gscores, 1, z.ldL}, Operand<acc_t>{s.q, 1, z.ldF});
    for_each_entry(t, [&](int64_t j, int64_t f, acc_t v) { a.grad_k[bth(d, c.b, c.t0 + j, c.h, d.F) + f] = v; });
  });
}

// dw = alpha * (K dU) + (M * Q K^T)^T G (len x E) -> grad_v rows (the first D columns); num[j, e] = (K dU)[j, e]
// w[j, e], the terms of x_j = k_j^T dU w_j.
template <typename Tile, typename acc_t, typename Block>
TALK_BLOCK void value_gradients(const Block& blk, const RfaArgs<acc_t>& a, const Chunk& c, const Sizes& z,
                                const BwdBuffers<acc_t*>& s) {
  const RfaDims& d = a.d;
  for_each_tile<Tile>(blk, c.len, d.E, [&](Tile& t) {
    accumulate(blk, t, d.F, Operand<acc_t>{s.k, z.ldF, 1}, Operand<acc_t>{s.dstate, 1, z.ldE});
    for_each_entry(t, [&](int64_t j, int64_t e, acc_t& v) {
      s.num[j * z.ldE + e] = v * s.w[j * z.ldE + e];
      v *= acc_exp(s.prefix[c.len] - s.prefix[j]);
    });
    accumulate(blk, t, c.len, Operand<acc_t>{s.scores, 1, z.ldL}, Operand<acc_t>{s.g, 1, z.ldE});
    for_each_entry(t, [&](int64_t j, int64_t e, acc_t v) {
      if (e < d.D) a.grad_v[bth(d, c.b, c.t0 + j, c.h, d.D) + e] = v;
    });
  });
}

// <dU, U> over the block (synchronises).
template <typename acc_t, typename Block>
TALK_BLOCK acc_t state_dot(Block& blk, const RfaDims& d, const Sizes& z, const BwdBuffers<acc_t*>& s) {
  acc_t dot = 0;
  for (int64_t i = blk.tid(); i < d.F * d.E; i += blk.size()) {
    const int64_t at = i / d.E * z.ldE + i % d.E;
    dot += s.dstate[at] * s.state[at];
  }
  return blk.reduce_sum(dot);
}

// x_j = sum_e num[j, e] (one thread per row), and g *= exp(C) (len x E), for the state adjoint's update.
template <typename acc_t, typename Block>
TALK_BLOCK void key_terms_and_scaled_gradients(const Block& blk, int64_t len, const RfaDims& d, const Sizes& z,
                                               const BwdBuffers<acc_t*>& s) {
  for (int64_t j = blk.tid(); j < len; j += blk.size()) {
    acc_t x = 0;
    for (int64_t e = 0; e < d.E; ++e) x += s.num[j * z.ldE + e];
    s.x[j] = x;
  }
  for (int64_t idx = blk.tid(); idx < len * d.E; idx += blk.size()) {
    const int64_t i = idx / d.E;
    s.g[i * z.ldE + idx % d.E] *= acc_exp(s.prefix[i]);
  }
}

// dU = exp(C_end) dU + Q^T G (F x E), G already scaled by exp(C).
template <typename Tile, typename acc_t, typename Block>
TALK_BLOCK void retreat_state_adjoint(const Block& blk, int64_t len, const RfaDims& d, const Sizes& z,
                                      const BwdBuffers<acc_t*>& s) {
  const acc_t keep = acc_exp(s.prefix[len]);
  for_each_tile<Tile>(blk, d.F, d.E, [&](Tile& t) {
    accumulate(blk, t, len, Operand<acc_t>{s.q, 1, z.ldF}, Operand<acc_t>{s.g, 1, z.ldE});
    for_each_entry(t, [&](int64_t f, int64_t e, acc_t v) {
      s.dstate[f * z.ldE + e] = keep * s.dstate[f * z.ldE + e] + v;
    });
  });
}

// scores = B = A M^T (len x len) and c = M x (one thread per row): the decay gradients' pair and key sums.
template <typename Tile, typename acc_t, typename Block>
TALK_BLOCK void decay_sums(const Block& blk, int64_t len, const Sizes& z, const BwdBuffers<acc_t*>& s) {
  for_each_tile<Tile>(blk, len, len, [&](Tile& t) {
    accumulate(blk, t, len, Operand<acc_t>{s.pairs, z.ldL, 1}, Operand<acc_t>{s.mask, z.ldL, 1});
    for_each_entry(t, [&](int64_t m, int64_t i, acc_t v) { s.scores[m * z.ldL + i] = v; });
  });
  for (int64_t i = blk.tid(); i < len; i += blk.size()) {
    acc_t sum = 0;
    for (int64_t j = 0; j <= i; ++j) sum += s.mask[i * z.ldL + j] * s.x[j];
    s.c[i] = sum;
  }
}

// d decay[t0 + i - 1] for i in [t0 == 0, len) (and i = len, decay[T-1], when `final_step`), one thread each.
template <typename acc_t, typename Block>
TALK_BLOCK void decay_gradients(const Block& blk, const RfaArgs<acc_t>& a, const Chunk& c, const Sizes& z,
                                const BwdBuffers<acc_t*>& s, acc_t state_dot, bool final_step) {
  const int64_t first = c.t0 == 0 ? 1 : 0, last = final_step ? c.len : c.len - 1;
  for (int64_t i = first + blk.tid(); i <= last; i += blk.size()) {
    const acc_t beta = i > 0 ? acc_exp(s.prefix[i - 1]) : acc_t(1);
    acc_t sum = acc_exp(s.prefix[c.len] - s.prefix[i]) * ((i > 0 ? s.c[i - 1] : acc_t(0)) + beta * state_dot);
    for (int64_t m = i; m < c.len; ++m)
      sum += s.mask[m * z.ldL + i] * ((i > 0 ? s.scores[m * z.ldL + i - 1] : acc_t(0)) + beta * s.y[m]);
    a.grad_decay[(c.b * a.d.T + c.t0 + i - 1) * a.d.H + c.h] = sum;
  }
}

// The backward kernel's body for block `block` of `grid` (checkpoints every d.chunk >= 1 steps, T >= 1).
template <typename Tile, typename acc_t, typename Block>
TALK_BLOCK void rfa_chunked_bwd_block(Block& blk, const RfaArgs<acc_t>& a, int64_t block, int64_t grid,
                                      acc_t* smem) {
  const RfaDims& d = a.d;
  const Sizes z = sizes<Tile>(d);
  const BwdBuffers<acc_t*> s = bwd_buffers<Tile>(smem, d);
  const int64_t S = d.F * d.E;
  for (int64_t bh = block; bh < d.B * d.H; bh += grid) {
    state_to_shared(blk, a.grad_final ? a.grad_final + bh * S : nullptr, s.dstate, d, z);
    for (int64_t n = d.N - 1; n >= 0; --n) {
      const Chunk c = chunk_at(d, z, bh, n);
      const bool final_step = n == d.N - 1;
      state_to_shared(blk, a.checkpoints + (bh * d.N + n) * S, s.state, d, z);
      load_chunk(blk, a, c, z, s.q, s.k, s.w, s.logs, final_step);
      load_grad_out(blk, a, c, s.grad_out);
      blk.sync();
      prefix_sums(blk, s.logs, c.len, s.prefix);
      query_key_products<Tile>(blk, s.q, s.k, c.len, d, z, s.pairs);
      queries_times_state<Tile>(blk, s.q, s.state, c.len, d, z, s.qu);
      blk.sync();
      decay_scores(blk, s.prefix, c.len, z, s.pairs, s.scores, s.mask);
      blk.sync();
      numerators<Tile>(blk, s.scores, s.w, s.qu, s.prefix, c.len, d, z, s.num);
      blk.sync();
      num_gradients(blk, a, c, z, s);
      blk.sync();
      value_products<Tile>(blk, c.len, d, z, s);
      blk.sync();
      query_gradients<Tile>(blk, a, c, z, s);
      key_gradients<Tile>(blk, a, c, z, s);
      value_gradients<Tile>(blk, a, c, z, s);
      const acc_t dot = state_dot(blk, d, z, s);  // synchronises
      key_terms_and_scaled_gradients(blk, c.len, d, z, s);
      blk.sync();
      retreat_state_adjoint<Tile>(blk, c.len, d, z, s);
      if (a.grad_decay) decay_sums<Tile>(blk, c.len, z, s);
      blk.sync();
      if (a.grad_decay) decay_gradients(blk, a, c, z, s, dot, final_step);
      blk.sync();
    }
    if (a.grad_init) state_to_global(blk, s.dstate, acc_t(1), a.grad_init + bh * S, d, z);
    blk.sync();
  }
}

}  // namespace rfa_chunked
}  // namespace talk_hf
