// The random feature map of RFA, one (b, t, h) row at a time, shared by the CPU and CUDA kernels (no torch headers).
// Specification: talk_hf/rfa.py (`rfa_feature_map_ref`):
//
//   u_f = (W_h x)_f / ((|x| + 1e-3) tau_h),   phi(x) = 0.1 [sin u_1, cos u_1, ..., sin u_D, cos u_D]
//
// The sine and cosine are polynomials (below) rather than the math library's: plain arithmetic, so that the CPU
// compiler vectorises a row's D evaluations, and the same numbers on both devices.
#pragma once
#include <math.h>
#include <stdint.h>

#include "host_device.h"

namespace talk_hf {

constexpr double kRfaFeatureScale = 0.1;  // FEATURE_SCALE in talk_hf/rfa.py
constexpr double kRfaNormEps = 1e-3;      // NORM_EPS

// sin and cos on [-pi/4, pi/4]: the Cephes library's minimax polynomials, sin r = r + r^3 S(r^2) and
// cos r = 1 - r^2 / 2 + r^4 C(r^2) (fp32: 3 terms each, fp64: 6).
TALK_HD float sin_poly(float z) { return (-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f; }
TALK_HD float cos_poly(float z) { return (2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f; }
TALK_HD double sin_poly(double z) {
  return ((((1.58962301576546568060e-10 * z - 2.50507477628578072866e-8) * z + 2.75573136213857245213e-6) * z -
           1.98412698295895385996e-4) * z + 8.33333333332211858878e-3) * z - 1.66666666666666307295e-1;
}
TALK_HD double cos_poly(double z) {
  return ((((-1.13585365213876817300e-11 * z + 2.08757008419747316778e-9) * z - 2.75573141792967388112e-7) * z +
           2.48015872888517045348e-5) * z - 1.38888888888730564116e-3) * z + 4.16666666666665929218e-2;
}

// u - j pi/2 with pi/2 in three parts, the first two short enough (fp32: 8 and 11 bits, fp64: 23 and 21) that
// j * part is exact for |j| < 2^13 (fp32) or 2^30 (fp64): the difference keeps full precision.
TALK_HD float reduce_pio2(float u, float j) {
  return ((u - j * 1.5703125f) - j * 4.837512969970703125e-4f) - j * 7.54978995489188216e-8f;
}
TALK_HD double reduce_pio2(double u, double j) {
  return ((u - j * 1.57079625129699707031e+0) - j * 7.54978941586159635335e-8) - j * 5.39030285815811905290e-15;
}

// round(v) for |v| < 2^22 (fp32) / 2^51 (fp64), in plain arithmetic: adding 1.5 * 2^23 (2^52) leaves no fraction bits.
TALK_HD float round_small(float v) { return (v + 12582912.0f) - 12582912.0f; }
TALK_HD double round_small(double v) { return (v + 6755399441055744.0) - 6755399441055744.0; }

// u held within |u| <= 2^22 (fp32) / 2^31 (fp64), where round_small(u * 2 / pi) is still a whole number and fits
// an int: past it the polynomials would be evaluated far outside [-pi/4, pi/4] (features of 1e3 at |u| ~ 1e8). A
// held u's sine and cosine are as meaningless as the reduction's bits there, but bounded; inf and NaN pass, to a NaN
// as torch.sin's. (One select on |u|: the vectoriser makes it a blend, where a chain of selects stays a branch.)
TALK_HD float hold_reducible(float u) {
  const float limit = 4194304.0f, a = fabsf(u);
  return (a > limit && a < INFINITY) ? copysignf(limit, u) : u;
}
TALK_HD double hold_reducible(double u) {
  const double limit = 2147483648.0, a = fabs(u);
  return (a > limit && a < double(INFINITY)) ? copysign(limit, u) : u;
}

// sin u and cos u, within a few units in the last place of the accumulation type for |u| < 8192 (fp32) or 2^29
// (fp64; beyond, the reduction loses bits gradually, and past hold_reducible's limit the result is only bounded):
// u = j pi/2 + r with |r| <= pi/4, the polynomials of r, and j's quadrant.
template <typename acc_t>
TALK_HD void rfa_sincos(acc_t u, acc_t& sine, acc_t& cosine) {
  u = hold_reducible(u);
  const acc_t j = round_small(u * acc_t(0.6366197723675813));  // u * 2 / pi
  const acc_t r = reduce_pio2(u, j);
  const acc_t z = r * r;
  const acc_t s = r + r * z * sin_poly(z);
  const acc_t c = acc_t(1) - acc_t(0.5) * z + z * z * cos_poly(z);
  const int quadrant = static_cast<int>(j) & 3;  // two's complement: -1 & 3 == 3 (int: vectorises on AVX2)
  const acc_t sin_abs = (quadrant & 1) ? c : s, cos_abs = (quadrant & 1) ? s : c;
  sine = quadrant >= 2 ? -sin_abs : sin_abs;
  cosine = (quadrant == 1 || quadrant == 2) ? -cos_abs : cos_abs;
}

// 1 / ((|x| + 1e-3) tau): the factor of a row's projections (x: the row's d entries).
template <typename acc_t>
TALK_HD acc_t rfa_feature_row_scale(const acc_t* x, int64_t d, acc_t tau) {
  acc_t sq = 0;
  for (int64_t c = 0; c < d; ++c) sq += x[c] * x[c];
  return acc_t(1) / ((sqrt(sq) + acc_t(kRfaNormEps)) * tau);
}

// Features 2f and 2f + 1 of a row from its projection u_f = (W_h x)_f * scale.
template <typename acc_t>
TALK_HD void rfa_feature_pair(acc_t u, acc_t* out_pair) {
  acc_t sine, cosine;
  rfa_sincos(u, sine, cosine);
  out_pair[0] = acc_t(kRfaFeatureScale) * sine;
  out_pair[1] = acc_t(kRfaFeatureScale) * cosine;
}

}  // namespace talk_hf
