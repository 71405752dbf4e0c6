// Matrix products over shared-memory tiles, for block programs (csrc/cuda/rfa_chunked_blocks.h), in two kinds with
// one interface:
//   - MicroTile<acc_t>: SIMT. Each thread owns kMicro x kMicro interleaved outputs of the product, so it reads
//     2 kMicro operands per kMicro^2 multiply-adds. Any type, exact fp32 / fp64 arithmetic.
//   - WarpTile: tensor cores. Each warp owns 16 x 8 outputs and runs mma.sync.m16n8k8 (TF32 operands, fp32
//     accumulation) over k in steps of 8; each lane holds 4 of the outputs.
// A program writes its product once, for any tile kind:
//   for_each_tile<Tile>(blk, m, n, [&](Tile& t) {
//     accumulate(blk, t, K, a, b);                            // t += A B^T over k < K (any number of times)
//     for_each_entry(t, [&](int64_t i, int64_t j, acc_t v) { ... });  // the outputs inside the m x n product
//   });
// and gets row strides for its shared tiles from Tile::stride(n) (bank-conflict-free for that kind's loads).
//
// The tensor-core step is the Block's: blk.mma_tf32(d, load) runs d += A B on a warp, where load(lane, a, b) gives
// a lane's operands (already rounded to TF32) in the PTX fragment layout of mma.m16n8k8 with .tf32 (g = lane / 4,
// c = lane % 4):
//   a[0..3] = A(g, c), A(g + 8, c), A(g, c + 4), A(g + 8, c + 4)      (A: 16 x 8, rows x k)
//   b[0..1] = B(c, g), B(c + 4, g)                                    (B: 8 x 8, k x columns)
//   d[0..3] = D(g, 2c), D(g, 2c + 1), D(g + 8, 2c), D(g + 8, 2c + 1)  (D: 16 x 8)
// On the GPU (rfa.cu's CudaBlock) each lane calls load for itself and the warp issues the instruction; the CPU
// emulator (tests/ops/cuda_tile_emulator.cpp) calls load for every lane and forms D from the same layout, so a
// loader that does not match the layout fails there. `load` must therefore depend on nothing but `lane` and
// warp-uniform values, and every lane of the warp must reach the same mma_tf32 calls (for_each_tile's loops are
// warp-uniform).
#pragma once
#include <stdint.h>
#include <string.h>

#include "../host_device.h"

namespace talk_hf {
namespace products {

constexpr int kMicro = 4;  // a thread's SIMT outputs are kMicro x kMicro tiles

// A matrix in shared memory: element (r, k) at p[r * row + k * col] (col = 1: a row-major tile; row = 1: the
// transpose of one).
template <typename acc_t>
struct Operand {
  const acc_t* p;
  int64_t row, col;
};

// x rounded to TF32 (10 mantissa bits, to nearest, ties away from zero), as an fp32 whose low 13 bits are zero;
// infinities and NaNs stay what they are. On sm_80 and newer the one instruction that does this (cvt.rna.tf32.f32);
// elsewhere (the host, the emulator) the same rounding in integer arithmetic.
TALK_HD float round_tf32(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t u;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(x));
  return __uint_as_float(u);
#else
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// ------------------------------------------------------------------------------------------------ SIMT

// A thread's outputs of an m x n product: (i0 + r * rs, j0 + c * cs) for r, c < kMicro. Interleaved, so that a
// warp's threads (consecutive j0) read consecutive rows of the right operand.
template <typename acc_t>
struct MicroTile {
  static constexpr int kRows = kMicro, kCols = kMicro, kThreads = 1;
  // Odd row strides: a warp reading a column of consecutive rows hits distinct banks.
  static TALK_HD int64_t stride(int64_t n) { return n | 1; }
  static TALK_HD MicroTile at(int64_t r, int64_t c, int64_t rows, int64_t cols, int64_t m, int64_t n, int64_t) {
    return {r, c, rows, cols, m, n, {}};
  }
  int64_t i0, j0, rs, cs, m, n;
  acc_t v[kMicro][kMicro];
};

// t.v[r][c] += sum_{k < K} a(row r, k) b(column c, k). Rows and columns past the product read its last one (their
// sums are never used), so the operands need no padding.
template <typename acc_t, typename Block>
TALK_BLOCK void accumulate(const Block&, MicroTile<acc_t>& t, int64_t K, const Operand<acc_t>& a,
                           const Operand<acc_t>& b) {
  const acc_t* ar[kMicro];
  const acc_t* bc[kMicro];
  TALK_UNROLL
  for (int r = 0; r < kMicro; ++r) ar[r] = a.p + min64(t.i0 + r * t.rs, t.m - 1) * a.row;
  TALK_UNROLL
  for (int c = 0; c < kMicro; ++c) bc[c] = b.p + min64(t.j0 + c * t.cs, t.n - 1) * b.row;
  for (int64_t k = 0; k < K; ++k) {
    acc_t x[kMicro], y[kMicro];
    TALK_UNROLL
    for (int r = 0; r < kMicro; ++r) x[r] = ar[r][k * a.col];
    TALK_UNROLL
    for (int c = 0; c < kMicro; ++c) y[c] = bc[c][k * b.col];
    TALK_UNROLL
    for (int r = 0; r < kMicro; ++r) {
      TALK_UNROLL
      for (int c = 0; c < kMicro; ++c) t.v[r][c] += x[r] * y[c];
    }
  }
}

// fn(i, j, value) for the tile's outputs inside the product (value may be taken by reference and changed).
template <typename acc_t, typename Fn>
TALK_BLOCK void for_each_entry(MicroTile<acc_t>& t, Fn fn) {
  TALK_UNROLL
  for (int r = 0; r < kMicro; ++r) {
    const int64_t i = t.i0 + r * t.rs;
    TALK_UNROLL
    for (int c = 0; c < kMicro; ++c) {
      const int64_t j = t.j0 + c * t.cs;
      if (i < t.m && j < t.n) fn(i, j, t.v[r][c]);
    }
  }
}

// ------------------------------------------------------------------------------------------------ tensor cores

// A warp's 16 x 8 outputs at (i0, j0) of an m x n product; this lane's four are d[q] at (i0 + g + 8 (q / 2),
// j0 + 2c + q % 2).
struct WarpTile {
  static constexpr int kRows = 16, kCols = 8, kThreads = 32;
  // Row strides = 4 mod 32: the eight groups g of a fragment load read rows g, so a row-major load hits 4g + c,
  // 32 distinct banks, and a transposed one (rows c, c + 4 of the transpose) g + 4c: at most two lanes a bank.
  static TALK_HD int64_t stride(int64_t n) { return n + ((36 - n % 32) % 32); }
  static TALK_HD WarpTile at(int64_t r, int64_t c, int64_t, int64_t, int64_t m, int64_t n, int64_t lane) {
    return {r * kRows, c * kCols, m, n, static_cast<int>(lane), {0.f, 0.f, 0.f, 0.f}};
  }
  int64_t i0, j0, m, n;
  int lane;
  float d[4];
};

// t.d += A B over k < K: A(r, k) = a(i0 + r, k), B(k, c) = b(j0 + c, k), in steps of 8 (operands past K are zeros,
// never read; rows and columns past the product read its last one, as MicroTile's).
template <typename Block>
TALK_BLOCK void accumulate(const Block& blk, WarpTile& t, int64_t K, const Operand<float>& a,
                           const Operand<float>& b) {
  for (int64_t k0 = 0; k0 < K; k0 += 8) {
    blk.mma_tf32(t.d, [&](int lane, float(&fa)[4], float(&fb)[2]) {
      const int g = lane / 4, c = lane % 4;
      const float* a0 = a.p + min64(t.i0 + g, t.m - 1) * a.row;
      const float* a8 = a.p + min64(t.i0 + g + 8, t.m - 1) * a.row;
      const float* bg = b.p + min64(t.j0 + g, t.n - 1) * b.row;
      const int64_t k = k0 + c, k4 = k + 4;
      fa[0] = k < K ? round_tf32(a0[k * a.col]) : 0.f;
      fa[1] = k < K ? round_tf32(a8[k * a.col]) : 0.f;
      fa[2] = k4 < K ? round_tf32(a0[k4 * a.col]) : 0.f;
      fa[3] = k4 < K ? round_tf32(a8[k4 * a.col]) : 0.f;
      fb[0] = k < K ? round_tf32(bg[k * b.col]) : 0.f;
      fb[1] = k4 < K ? round_tf32(bg[k4 * b.col]) : 0.f;
    });
  }
}

template <typename Fn>
TALK_BLOCK void for_each_entry(WarpTile& t, Fn fn) {
  const int g = t.lane / 4, c = t.lane % 4;
  TALK_UNROLL
  for (int q = 0; q < 4; ++q) {
    const int64_t i = t.i0 + g + 8 * (q / 2), j = t.j0 + 2 * c + q % 2;
    if (i < t.m && j < t.n) fn(i, j, t.d[q]);
  }
}

// ------------------------------------------------------------------------------------------------ both

// body(tile) for each of this thread's tiles of an m x n product (a warp's, for WarpTile), accumulators zeroed.
// Tiles go round-robin over the block's threads (warps); a WarpTile needs whole warps, and threads past the last
// whole warp take none.
template <typename Tile, typename Block, typename Body>
TALK_BLOCK void for_each_tile(const Block& blk, int64_t m, int64_t n, Body body) {
  const int64_t rows = cdiv(m, Tile::kRows), cols = cdiv(n, Tile::kCols);
  const int64_t worker = blk.tid() / Tile::kThreads, workers = blk.size() / Tile::kThreads;
  if (worker >= workers) return;
  for (int64_t idx = worker; idx < rows * cols; idx += workers) {
    Tile t = Tile::at(idx / cols, idx % cols, rows, cols, m, n, blk.tid() % Tile::kThreads);
    body(t);
  }
}

}  // namespace products
}  // namespace talk_hf
