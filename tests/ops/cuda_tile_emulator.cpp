// Runs the block programs of the fused CUDA TaLK kernels (csrc/cuda/talk_conv_tiles.h) on the CPU, the way
// csrc/cuda/talk_conv.cu launches them: every block of the grid, its phases in order, each phase for every thread of
// the block (in lane order, or reversed to show that no thread reads what another writes in the same phase), with
// shared memory filled with NaN first so that reading a word no phase wrote shows up in the result.
// Built by tests/ops/test_cuda_tile_programs.py with the host compiler alone (no torch, no CUDA) and called
// through ctypes. Pass tile <= 0 to use the launch shapes of talk_conv.cu.
// The RFA kernels' block programs (csrc/cuda/rfa_blocks.h) and the TaLK grad-x warp program, whose barriers sit
// inside loops, run on FiberBlock:
// one fiber (ucontext) per thread, each run up to its next barrier in thread order (or reversed) before the next
// one starts, so the same phase semantics hold for any program; fibers that reach different numbers of barriers
// (a barrier only some threads reach) are reported. A warp's tensor-core step (mma_tf32, csrc/cuda/tile_products.h)
// is formed from the PTX fragment layout of mma.m16n8k8 .tf32, independently of the program's loader.
#include <ucontext.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "cuda/dynamic_conv_tiles.h"
#include "cuda/rfa_blocks.h"
#include "cuda/talk_conv_tiles.h"
#include "dynamic_conv_math.h"
#include "dynamic_conv_step.h"
#include "softmax_row.h"
#include "talk_conv_step.h"

namespace talk_hf {

// bf16 as the CUDA kernels store it (__nv_bfloat16: the upper half of an fp32, rounded to nearest even), so that
// the programs' low-precision paths run here too. It converts only through to_acc / from_acc, as the CUDA types do
// under torch's __CUDA_NO_*_CONVERSIONS__ flags (an implicit conversion in a program would not compile).
struct HostBF16 {
  uint16_t bits;
};

inline float to_acc(HostBF16 v) {
  const uint32_t u = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

template <>
struct StoreAs<HostBF16> {
  static HostBF16 cast(float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) return {0x7fc0};  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);                        // round to nearest even
    return {static_cast<uint16_t>(u >> 16)};
  }
};

}  // namespace talk_hf

namespace {

using namespace talk_hf;
using namespace talk_hf::tiles;

template <typename T>
TalkArgs<T> make_args(const T* x, const T* ol, const T* orr, int64_t B, int64_t L, int64_t C, int64_t H,
                      int64_t max_left, int64_t max_right) {
  TalkArgs<T> a{};
  a.x = x;
  a.offset_left = ol;
  a.offset_right = orr;
  a.B = B;
  a.T = L;
  a.C = C;
  a.H = H;
  a.R = C / H;
  a.max_left = max_left;
  a.max_right = max_right;
  a.has_right = orr != nullptr;
  return a;
}

// A thread block of `n` fibers running one block program (see the top of this file).
class FiberBlock {
 public:
  // The Block interface of the block programs, for one fiber.
  struct Thread {
    FiberBlock* block;
    int id;
    int64_t tid() const { return id; }
    int64_t size() const { return block->n_; }
    void sync() const { block->barrier(id); }
    // d += A B for this lane's four outputs, where A(r, k) and B(k, c) are the registers that the PTX layout puts
    // them in (A: lane 4 (r % 8) + k % 4, register r / 8 + 2 (k / 4); B: lane 4 c + k % 4, register k / 4), as
    // load(lane, a, b) gives them for each lane of this thread's warp (the program's loader: warp-uniform, so this
    // lane's copy serves all 32). Products exact, sums in double.
    template <typename Load>
    void mma_tf32(float (&d)[4], Load load) const {
      float a[32][4], b[32][2];
      for (int lane = 0; lane < 32; ++lane) load(lane, a[lane], b[lane]);
      const int g = id % 32 / 4, c = id % 4;
      for (int q = 0; q < 4; ++q) {
        const int r = g + 8 * (q / 2), col = 2 * c + q % 2;
        double sum = d[q];
        for (int k = 0; k < 8; ++k)
          sum += static_cast<double>(a[4 * (r % 8) + k % 4][r / 8 + 2 * (k / 4)]) * b[4 * col + k % 4][k / 4];
        d[q] = static_cast<float>(sum);
      }
    }
    template <typename T>
    T reduce_sum(T v) const {  // every thread gets the sum, in thread order; synchronises like CudaBlock's
      block->scratch_[id] = static_cast<double>(v);
      sync();
      T total = 0;
      for (int i = 0; i < block->n_; ++i) total += static_cast<T>(block->scratch_[i]);
      sync();
      return total;
    }
  };

  FiberBlock(int n, bool reverse) : n_(n), reverse_(reverse), ctx_(n), stacks_(n), syncs_(n, 0), done_(n, false),
                                    scratch_(n, std::numeric_limits<double>::quiet_NaN()) {}

  // Runs body(thread) on every fiber; false if the fibers did not all reach the same barriers.
  template <typename Body>
  bool run(Body body) {
    body_ = [&body](Thread& t) { body(t); };
    for (int i = 0; i < n_; ++i) {
      stacks_[i].resize(1 << 16);
      getcontext(&ctx_[i]);
      ctx_[i].uc_stack.ss_sp = stacks_[i].data();
      ctx_[i].uc_stack.ss_size = stacks_[i].size();
      ctx_[i].uc_link = &main_;
      makecontext(&ctx_[i], &FiberBlock::entry, 0);
    }
    bool consistent = true;
    for (int64_t round = 0; !std::all_of(done_.begin(), done_.end(), [](bool d) { return d; }); ++round) {
      for (int i = 0; i < n_; ++i) {
        const int id = reverse_ ? n_ - 1 - i : i;
        if (done_[id]) continue;
        current_ = id;
        running_ = this;
        swapcontext(&main_, &ctx_[id]);
      }
      const bool any_done = std::any_of(done_.begin(), done_.end(), [](bool d) { return d; });
      for (int id = 0; id < n_; ++id) consistent &= done_[id] ? true : (!any_done && syncs_[id] == round + 1);
      if (!consistent) return false;  // some threads left, others wait at a barrier: stop (they would never return)
    }
    return std::all_of(syncs_.begin(), syncs_.end(), [&](int64_t s) { return s == syncs_[0]; });
  }

 private:
  static void entry() {
    FiberBlock* self = running_;
    const int id = self->current_;
    Thread t{self, id};
    self->body_(t);
    self->done_[id] = true;  // returns to main_ through uc_link
  }

  void barrier(int id) {
    ++syncs_[id];
    swapcontext(&ctx_[id], &main_);
  }

  static inline thread_local FiberBlock* running_ = nullptr;
  int n_;
  bool reverse_;
  std::vector<ucontext_t> ctx_;
  std::vector<std::vector<char>> stacks_;
  std::vector<int64_t> syncs_;
  std::vector<bool> done_;
  std::vector<double> scratch_;
  ucontext_t main_{};
  int current_ = 0;
  std::function<void(Thread&)> body_;
};

// Blocks 0 .. blocks - 1 of a block program in turn, each on `threads` fresh fibers and `smem_elems` accumulators of
// NaN-poisoned shared memory: body(thread, block, smem). -> false if some block's threads reached different barriers.
template <typename acc_t, typename Body>
bool run_blocks(int64_t blocks, int64_t threads, int64_t smem_elems, bool reverse, Body body) {
  std::vector<acc_t> smem(smem_elems);
  for (int64_t block = 0; block < blocks; ++block) {
    smem.assign(smem.size(), std::numeric_limits<acc_t>::quiet_NaN());
    FiberBlock fibers(static_cast<int>(threads), reverse);
    if (!fibers.run([&](FiberBlock::Thread& t) { body(t, block, smem.data()); })) return false;
  }
  return true;
}

// Thread `i` of `n` in the chosen order.
inline int thread_at(int i, int n, bool reverse) { return reverse ? n - 1 - i : i; }

template <typename T>
void forward(TalkArgs<T> a, int64_t tile, int64_t rows, int warps, bool reverse) {
  using acc_t = acc_type<T>;
  set_fwd_shape(a, sizeof(acc_t));
  if (tile > 0) {
    a.tile = tile;
    a.rows = rows;
    a.warps = warps;
  }
  // Poisoned (all bytes 0xff): accumulators NaN, window rows -1 with NaN fractions; one more NaN row before the
  // table, so that a window read before it was written reads NaN.
  const int64_t guard = kLanes * static_cast<int64_t>(sizeof(acc_t));
  std::vector<double> smem(cdiv(guard + fwd_shared_bytes(a, sizeof(acc_t)), sizeof(double)));
  unsigned char* shared = reinterpret_cast<unsigned char*>(smem.data()) + guard;
  acc_t* table = reinterpret_cast<acc_t*>(shared);
  acc_t* carry = table + a.rows * kLanes;
  auto* windows = reinterpret_cast<WindowRows<acc_t>*>(shared + fwd_accumulators_bytes(a.rows, a.warps, sizeof(acc_t)));
  const int n = a.warps * kLanes;
  for (int64_t block = 0; block < num_tiles(a); ++block) {
    const FwdBlock k = fwd_block(a, block);
    std::memset(smem.data(), 0xff, smem.size() * sizeof(double));
    for (int i = 0; i < n; ++i) {
      const int tid = thread_at(i, n, reverse);
      fwd_scan(a, k, table, tid / kLanes, tid % kLanes);
      fwd_windows(a, k, windows, tid / kLanes, tid % kLanes);
    }
    for (int i = 0; i < n; ++i) {
      const int tid = thread_at(i, n, reverse);
      fwd_carry(a, k, table, carry, tid / kLanes, tid % kLanes);
    }
    for (int i = 0; i < n; ++i) {
      const int tid = thread_at(i, n, reverse);
      fwd_add_carry(a, k, table, carry, tid / kLanes, tid % kLanes);
    }
    for (int i = 0; i < n; ++i) {
      const int tid = thread_at(i, n, reverse);
      fwd_gather(a, k, table, windows, tid / kLanes, tid % kLanes);
    }
  }
}

// -> 0, or 1 if the lanes of a grad-x warp reached different barriers.
template <typename T>
int backward(TalkArgs<T> a, int64_t tile, bool reverse) {
  using acc_t = acc_type<T>;
  std::vector<unsigned long long> reach(a.B * a.H * 2, 0);
  a.reach = reach.data();
  for (int64_t b = 0; b < a.B; ++b)  // reach kernel: atomicMax per (b, chunk of kReachSteps steps, h)
    for (int64_t t0 = 0; t0 < a.T; t0 += kReachSteps)
      for (int64_t h = 0; h < a.H; ++h) {
        int64_t before, after;
        reach_of_steps(a, b, h, t0, std::min(a.T, t0 + kReachSteps), &before, &after);
        unsigned long long* r = reach.data() + (b * a.H + h) * 2;
        r[0] = std::max<unsigned long long>(r[0], static_cast<unsigned long long>(before));
        r[1] = std::max<unsigned long long>(r[1], static_cast<unsigned long long>(after));
      }
  const int group = offset_grad_group(a.R);
  for (int64_t b = 0; b < a.B; ++b)  // offset-gradient kernel: the group's lanes, then their sum
    for (int64_t t = 0; t < a.T; ++t)
      for (int64_t h = 0; h < a.H; ++h) {
        acc_t left = 0, right = 0;
        for (int r0 = 0; r0 < group; ++r0) {
          acc_t pl, pr;
          offset_grad_partial(a, b, t, h, r0, group, &pl, &pr);
          left += pl;
          right += pr;
        }
        write_offset_grads(a, (b * a.T + t) * a.H + h, left, right);
      }
  set_gx_shape(a, sizeof(acc_t));
  if (tile > 0) a.tile = tile;
  // One warp's shared memory, poisoned (all bytes 0xff): q NaN; ends to the carry with NaN weights.
  std::vector<double> smem(cdiv(gx_warp_bytes(a, sizeof(acc_t)), sizeof(double)));
  acc_t* q = reinterpret_cast<acc_t*>(smem.data());
  auto* ends = reinterpret_cast<EndTargets<acc_t>*>(reinterpret_cast<unsigned char*>(smem.data()) +
                                                     gx_q_bytes(a, sizeof(acc_t)));
  for (int64_t unit = 0; unit < num_tiles(a); ++unit) {  // grad-x kernel: one warp per unit, a fiber per lane
    std::memset(smem.data(), 0xff, smem.size() * sizeof(double));
    FiberBlock warp(kLanes, reverse);
    if (!warp.run([&](FiberBlock::Thread& lane) { gx_warp(lane, a, tile_at(a, unit), q, ends); })) return 1;
  }
  return 0;
}

// The decoding-step kernel: one thread per column (b, c), in either order, over a NaN-poisoned ext workspace.
template <typename T>
void step(TalkStepArgs<T> a, bool reverse) {
  const int64_t r = a.max_left + 2;
  std::vector<acc_type<T>> ext(a.B * (r + a.T) * a.C, std::numeric_limits<acc_type<T>>::quiet_NaN());
  a.ext = ext.data();
  const int64_t n = a.B * a.C;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t col = reverse ? n - 1 - i : i;
    talk_step_column(a, col / a.C, col % a.C);
  }
}

// The dynamic-convolution decoding-step kernel: one thread per column (b, c), in either order.
template <typename T>
void conv_step(const ConvStepArgs<T>& a, bool reverse) {
  const int64_t n = a.B * a.C;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t col = reverse ? n - 1 - i : i;
    conv_step_column(a, col / a.C, col % a.C);
  }
}

// The dynamic-convolution kernels of csrc/cuda/dynamic_conv.cu: every element (in either order), the weight-gradient
// block program on fibers, the rows passes (taps, weight gradients) around them, each row's lanes' partial maxima,
// sums and dot products combined as the all-reduce shuffles combine them, then every lane writing its taps.

template <typename T>
SoftmaxStats<acc_type<T>> row_stats(const T* row, int64_t K, int group) {
  using acc_t = acc_type<T>;
  acc_t m = softmax_lane_max(row, K, 0, group), sum = 0;
  for (int lane = 1; lane < group; ++lane) m = std::max(m, softmax_lane_max(row, K, lane, group));
  for (int lane = 0; lane < group; ++lane) sum += softmax_lane_sum(row, K, m, lane, group);
  return {m, acc_t(1) / sum};
}

// taps_rows_kernel: taps (laid out as the weights, NaN-poisoned first) of every weight row.
template <typename T>
std::vector<acc_type<T>> taps_rows(const T* w, const ConvDims& d, bool softmax, const DropConnect<acc_type<T>>& dc) {
  using acc_t = acc_type<T>;
  const int group = softmax_group_lanes(d.K);
  std::vector<acc_t> taps(weight_rows(d) * d.K, std::numeric_limits<acc_t>::quiet_NaN());
  for (int64_t row = 0; row < weight_rows(d); ++row) {
    const T* r = w + row * d.K;
    const SoftmaxStats<acc_t> s = softmax ? row_stats(r, d.K, group) : SoftmaxStats<acc_t>{acc_t(0), acc_t(1)};
    for (int lane = 0; lane < group; ++lane)
      taps_lane_write(r, d.K, softmax, s, dc, row * d.K, taps.data() + row * d.K, lane, group);
  }
  return taps;
}

template <typename T>
void conv_fwd(const T* x, const T* w, T* out, const ConvDims& d, bool softmax, const DropConnect<acc_type<T>>& dc,
              bool reverse) {
  const int64_t n = d.B * d.T * d.C;
  if (!softmax && !dc.on) {
    for (int64_t i = 0; i < n; ++i) conv_fwd_element(x, w, out, d, reverse ? n - 1 - i : i);
    return;
  }
  const std::vector<acc_type<T>> taps = taps_rows(w, d, softmax, dc);
  for (int64_t i = 0; i < n; ++i) conv_fwd_element(x, taps.data(), out, d, reverse ? n - 1 - i : i);
}

// The weight-gradient kernel. -> false if some block's threads reached different barriers.
template <typename T, typename gw_t>
bool conv_weight_grad(const T* g, const T* x, gw_t* gw, const ConvDims& d, bool reverse) {
  using namespace conv_tiles;
  return run_blocks<acc_type<T>>(wg_num_blocks(d), wg_threads(d), wg_shared_elems(d), reverse,
                                 [&](auto& t, int64_t block, auto* smem) { wg_block_program(t, x, g, gw, d, block, smem); });
}

// weight_grad_rows_kernel over the B*T*H rows of gp.
template <typename T>
void weight_grad_rows(const T* w, const acc_type<T>* taps, const acc_type<T>* gp, T* gw, const ConvDims& d,
                      bool softmax, const DropConnect<acc_type<T>>& dc) {
  using acc_t = acc_type<T>;
  const int group = softmax_group_lanes(d.K);
  for (int64_t row = 0; row < d.B * d.T * d.H; ++row) {
    const int64_t bt = row / d.H, first = bt * d.ws + (row - bt * d.H) * d.K;
    const acc_t* gpr = gp + row * d.K;
    acc_t dot = 0;
    if (!dc.on) {
      for (int lane = 0; lane < group; ++lane) dot += softmax_grad_lane_dot(taps + first, gpr, d.K, lane, group);
      for (int lane = 0; lane < group; ++lane)
        softmax_grad_lane_write(taps + first, gpr, d.K, dot, gw + row * d.K, lane, group);
      continue;
    }
    const SoftmaxStats<acc_t> s = softmax ? row_stats(w + first, d.K, group) : SoftmaxStats<acc_t>{acc_t(0), acc_t(1)};
    for (int lane = 0; softmax && lane < group; ++lane)
      dot += dropconnect_grad_lane_dot(w + first, s, gpr, dc, first, d.K, lane, group);
    for (int lane = 0; lane < group; ++lane)
      dropconnect_grad_lane_write(w + first, softmax, s, gpr, dc, first, d.K, dot, gw + row * d.K, lane, group);
  }
}

// -> 0, or 1 if the weight-gradient threads reached different barriers.
template <typename T>
int conv_bwd(const T* g, const T* x, const T* w, T* gx, T* gw, const ConvDims& d, bool softmax,
             const DropConnect<acc_type<T>>& dc, bool reverse) {
  using acc_t = acc_type<T>;
  const int64_t n = d.B * d.T * d.C;
  if (!softmax && !dc.on) {
    for (int64_t i = 0; i < n; ++i) conv_grad_x_element(w, g, gx, d, reverse ? n - 1 - i : i);
    return conv_weight_grad(g, x, gw, d, reverse) ? 0 : 1;
  }
  const std::vector<acc_t> taps = taps_rows(w, d, softmax, dc);
  for (int64_t i = 0; i < n; ++i) conv_grad_x_element(taps.data(), g, gx, d, reverse ? n - 1 - i : i);
  std::vector<acc_t> gp(d.B * d.T * d.H * d.K, std::numeric_limits<acc_t>::quiet_NaN());
  if (!conv_weight_grad(g, x, gp.data(), d, reverse)) return 1;
  weight_grad_rows(w, taps.data(), gp.data(), gw, d, softmax, dc);
  return 0;
}

// light: the weights are one (H, K) LightConv kernel for every position (position stride 0).
ConvDims conv_dims(int64_t B, int64_t L, int64_t C, int64_t H, int64_t K, int64_t P, int light) {
  return ConvDims{B, L, C, H, C / H, K, P, light ? 0 : H * K};
}

// Every block of the grid, with the shared memory rfa.cu gives the per-step kernels.
// -> 0, or 1 if some block's threads reached different barriers.
template <typename acc_t, typename Program>
int run_rfa_grid(const rfa_blocks::RfaArgs<acc_t>& a, int64_t grid, int threads, bool reverse, Program program) {
  const auto body = [&](auto& t, int64_t block, acc_t* smem) { program(t, a, block, grid, smem); };
  return run_blocks<acc_t>(grid, threads, rfa_blocks::rfa_shared_elems(a.d), reverse, body) ? 0 : 1;
}

template <typename acc_t>
rfa_blocks::RfaArgs<acc_t> rfa_args(int64_t B, int64_t L, int64_t H, int64_t F, int64_t D, int64_t chunk,
                                    double eps) {
  rfa_blocks::RfaArgs<acc_t> a{};
  a.d = rfa_blocks::RfaDims{B, L, H, F, D, D + 1, chunk, rfa_num_chunks(L, chunk)};
  a.eps = static_cast<acc_t>(eps);
  return a;
}

}  // namespace

#define TALK_EMULATE(SUFFIX, T)                                                                                     \
  extern "C" int talk_conv_fwd_emulate_##SUFFIX(const T* x, const T* ol, const T* orr, T* out, int64_t B,         \
                                                int64_t L, int64_t C, int64_t H, int64_t max_left,                 \
                                                int64_t max_right, int64_t tile, int64_t rows, int warps,          \
                                                int reverse) {                                                     \
    TalkArgs<T> a = make_args<T>(x, ol, orr, B, L, C, H, max_left, max_right);                                     \
    a.out = out;                                                                                                   \
    forward(a, tile, rows, warps, reverse != 0);                                                                   \
    return 0;                                                                                                      \
  }                                                                                                                \
  extern "C" int talk_conv_bwd_emulate_##SUFFIX(const T* g, const T* x, const T* ol, const T* orr, T* gx, T* gol, \
                                                T* gor, int64_t B, int64_t L, int64_t C, int64_t H,                \
                                                int64_t max_left, int64_t max_right, int64_t tile, int reverse) {  \
    TalkArgs<T> a = make_args<T>(x, ol, orr, B, L, C, H, max_left, max_right);                                     \
    a.grad_out = g;                                                                                                \
    a.grad_x = gx;                                                                                                 \
    a.grad_offset_left = gol;                                                                                      \
    a.grad_offset_right = gor;                                                                                     \
    return backward(a, tile, reverse != 0);                                                                        \
  }                                                                                                                \
  extern "C" int talk_conv_step_emulate_##SUFFIX(const T* x, const T* ol, const acc_type<T>* state, T* out,          \
                                                 acc_type<T>* new_state,                                           \
                                                 int64_t B, int64_t L, int64_t C, int64_t H, int64_t max_left,     \
                                                 int reverse) {                                                    \
    step(TalkStepArgs<T>{x, ol, state, out, new_state, nullptr, B, L, C, H, max_left}, reverse != 0);             \
    return 0;                                                                                                      \
  }                                                                                                                \
  extern "C" int dynamic_conv_step_emulate_##SUFFIX(const T* x, const T* w, const T* state, T* out, T* new_state,  \
                                                    int64_t B, int64_t L, int64_t C, int64_t H, int64_t K,         \
                                                    int softmax, int reverse) {                                    \
    conv_step(ConvStepArgs<T>{x, w, state, out, new_state, B, L, C, H, K, softmax != 0, H * K}, reverse != 0);     \
    return 0;                                                                                                      \
  }                                                                                                                \
  extern "C" int dynamic_conv_fwd_emulate_##SUFFIX(const T* x, const T* w, T* out, int64_t B, int64_t L, int64_t C, \
                                                   int64_t H, int64_t K, int64_t P, int softmax, int light,        \
                                                   int64_t seed, double weight_dropout, int reverse) {             \
    conv_fwd(x, w, out, conv_dims(B, L, C, H, K, P, light), softmax != 0,                                          \
             make_dropconnect<acc_type<T>>(weight_dropout, seed), reverse != 0);                                   \
    return 0;                                                                                                      \
  }                                                                                                                \
  extern "C" int dynamic_conv_bwd_emulate_##SUFFIX(const T* g, const T* x, const T* w, T* gx, T* gw, int64_t B,     \
                                                   int64_t L, int64_t C, int64_t H, int64_t K, int64_t P,          \
                                                   int softmax, int light, int64_t seed, double weight_dropout,    \
                                                   int reverse) {                                                  \
    return conv_bwd(g, x, w, gx, gw, conv_dims(B, L, C, H, K, P, light), softmax != 0,                             \
                    make_dropconnect<acc_type<T>>(weight_dropout, seed), reverse != 0);                            \
  }

#define RFA_EMULATE(SUFFIX, T)                                                                                      \
  extern "C" int rfa_fwd_emulate_##SUFFIX(const T* q, const T* k, const T* v, const T* decay, const T* init,        \
                                          double eps, T* out, T* state, T* checkpoints, int64_t B, int64_t L,      \
                                          int64_t H, int64_t F, int64_t D, int64_t chunk, int64_t grid,            \
                                          int threads, int reverse) {                                              \
    rfa_blocks::RfaArgs<T> a = rfa_args<T>(B, L, H, F, D, chunk, eps);                                             \
    a.q = q, a.k = k, a.v = v, a.decay = decay, a.init = init, a.out = out, a.state = state;                       \
    a.checkpoints = checkpoints;                                                                                   \
    return run_rfa_grid(a, grid, threads, reverse != 0,                                                          \
                        [](auto& t, const auto& args, int64_t blk, int64_t g, T* smem) {                           \
                          rfa_blocks::rfa_fwd_block(t, args, blk, g, smem);                                       \
                        });                                                                                        \
  }                                                                                                                \
  extern "C" int rfa_bwd_emulate_##SUFFIX(const T* go, const T* gfinal, const T* q, const T* k, const T* v,         \
                                          const T* decay, T* checkpoints, double eps, T* gq, T* gk, T* gv,         \
                                          T* gdecay, T* ginit, T* workspace, int64_t B, int64_t L, int64_t H,      \
                                          int64_t F, int64_t D, int64_t chunk, int64_t grid, int threads,          \
                                          int reverse) {                                                           \
    rfa_blocks::RfaArgs<T> a = rfa_args<T>(B, L, H, F, D, chunk, eps);                                             \
    a.grad_out = go, a.grad_final = gfinal, a.q = q, a.k = k, a.v = v, a.decay = decay;                            \
    a.checkpoints = checkpoints, a.grad_q = gq, a.grad_k = gk, a.grad_v = gv, a.grad_decay = gdecay;               \
    a.grad_init = ginit, a.workspace = workspace;                                                                  \
    return run_rfa_grid(a, grid, threads, reverse != 0,                                                          \
                        [](auto& t, const auto& args, int64_t blk, int64_t g, T* smem) {                           \
                          rfa_blocks::rfa_bwd_block(t, args, blk, g, smem);                                       \
                        });                                                                                        \
  }

// Shared memory the launches of talk_conv.cu ask for (fwd: one block, grad x: one block of kGradXWarps units).
extern "C" int64_t talk_conv_shared_bytes(int64_t acc_bytes, int64_t max_left, int64_t max_right, int64_t H,
                                          int64_t R, int backward) {
  TalkArgs<float> a{};
  a.H = H;
  a.R = R;
  a.max_left = max_left;
  a.max_right = max_right;
  if (backward) {
    set_gx_shape(a, acc_bytes);
    return gx_shared_bytes(a, acc_bytes);
  }
  set_fwd_shape(a, acc_bytes);
  return fwd_shared_bytes(a, acc_bytes);
}

TALK_EMULATE(f32, float)
TALK_EMULATE(f64, double)
TALK_EMULATE(bf16, HostBF16)
RFA_EMULATE(f32, float)
RFA_EMULATE(f64, double)

// The chunked RFA block programs (csrc/cuda/rfa_chunked_blocks.h) on FiberBlock, every block of the grid with the
// shared memory rfa.cu asks for; threads <= 0: rfa.cu's block size.
#include "cuda/rfa_chunked_blocks.h"

namespace {

template <typename Tile, typename acc_t, typename Program>
int run_rfa_chunked_grid(const rfa_blocks::RfaArgs<acc_t>& a, bool backward, int64_t grid, int threads, bool reverse,
                         Program program) {
  const int64_t elems = rfa_chunked::shared_bytes<Tile>(a.d, sizeof(acc_t), backward) / sizeof(acc_t);
  const int64_t n = threads > 0 ? threads : rfa_chunked::chunked_threads(a.d);
  const auto body = [&](auto& t, int64_t block, acc_t* smem) { program(t, a, block, grid, smem); };
  return run_blocks<acc_t>(grid, n, elems, reverse, body) ? 0 : 1;
}

}  // namespace

// SUFFIX names the entry points; T is the accumulation type, TILE the products' tile kind (rfa.cu's choice).
#define RFA_CHUNKED_EMULATE(SUFFIX, T, TILE)                                                                        \
  extern "C" int rfa_chunked_fwd_emulate_##SUFFIX(const T* q, const T* k, const T* v, const T* decay, const T* init, \
                                                  double eps, T* out, T* state, T* checkpoints, int64_t B,         \
                                                  int64_t L, int64_t H, int64_t F, int64_t D, int64_t chunk,       \
                                                  int64_t grid, int threads, int reverse) {                        \
    rfa_blocks::RfaArgs<T> a = rfa_args<T>(B, L, H, F, D, chunk, eps);                                             \
    a.q = q, a.k = k, a.v = v, a.decay = decay, a.init = init, a.out = out, a.state = state;                       \
    a.checkpoints = checkpoints;                                                                                   \
    return run_rfa_chunked_grid<TILE>(a, false, grid, threads, reverse != 0,                                      \
                                      [](auto& t, const auto& args, int64_t blk, int64_t g, T* smem) {             \
                                        rfa_chunked::rfa_chunked_fwd_block<TILE>(t, args, blk, g, smem);          \
                                      });                                                                          \
  }                                                                                                                \
  extern "C" int rfa_chunked_bwd_emulate_##SUFFIX(const T* go, const T* gfinal, const T* q, const T* k, const T* v, \
                                                  const T* decay, T* checkpoints, double eps, T* gq, T* gk, T* gv, \
                                                  T* gdecay, T* ginit, int64_t B, int64_t L, int64_t H, int64_t F, \
                                                  int64_t D, int64_t chunk, int64_t grid, int threads,             \
                                                  int reverse) {                                                   \
    rfa_blocks::RfaArgs<T> a = rfa_args<T>(B, L, H, F, D, chunk, eps);                                             \
    a.grad_out = go, a.grad_final = gfinal, a.q = q, a.k = k, a.v = v, a.decay = decay;                            \
    a.checkpoints = checkpoints, a.grad_q = gq, a.grad_k = gk, a.grad_v = gv, a.grad_decay = gdecay;               \
    a.grad_init = ginit;                                                                                           \
    return run_rfa_chunked_grid<TILE>(a, true, grid, threads, reverse != 0,                                       \
                                      [](auto& t, const auto& args, int64_t blk, int64_t g, T* smem) {             \
                                        rfa_chunked::rfa_chunked_bwd_block<TILE>(t, args, blk, g, smem);          \
                                      });                                                                          \
  }

// Dynamic shared memory and block size of the chunked launches of rfa.cu (T > 1; chunk 0 stands for 64);
// tensor_cores: the warp-tile strides of its TF32 kernels.
extern "C" int64_t rfa_chunked_shared_bytes(int64_t acc_bytes, int64_t F, int64_t D, int64_t chunk, int backward,
                                            int tensor_cores) {
  const rfa_blocks::RfaDims d{1, 2, 1, F, D, D + 1, chunk, rfa_num_chunks(2, chunk)};
  return rfa_chunked::shared_bytes(d, acc_bytes, backward != 0, tensor_cores != 0);
}

extern "C" int64_t rfa_chunked_block_threads(int64_t F, int64_t D, int64_t chunk) {
  return rfa_chunked::chunked_threads(rfa_blocks::RfaDims{1, 2, 1, F, D, D + 1, chunk, rfa_num_chunks(2, chunk)});
}

// The tensor-core programs' operand rounding (csrc/cuda/tile_products.h), for n values.
extern "C" void round_tf32_emulate(const float* x, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = products::round_tf32(x[i]);
}

RFA_CHUNKED_EMULATE(f32, float, rfa_chunked::MicroTile<float>)
RFA_CHUNKED_EMULATE(f64, double, rfa_chunked::MicroTile<double>)
RFA_CHUNKED_EMULATE(tf32, float, rfa_chunked::WarpTile)
