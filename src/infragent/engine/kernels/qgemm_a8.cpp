// Products of GGUF blocks (Q4_1, Q8_0) with int8 activations, as llama.cpp computes them: each activation
// row is quantized per 32-element block (scale max|x| / 127, round to nearest even), the block products are
// exact integer sums, and each is scaled into an fp32 accumulator. With two digits, the rounding remainder
// (within half a step) is quantized again, in steps of 1/128 of the first: x = xd (q1 + q2 / 128) to within
// max|x| / 32512, and the block sum is 128 (w . q1) + (w . q2), still exact in int32. Registered as
// torch.ops.infragent.*:
//
// qpack_a8(qs, d, mins, kind) -> (packed, pd, pm)   the weight regrouped for the product below (once, at load)
// qlinear_a8(x [m, k], packed, pd, pm, row_scale, kind, n, digits) -> y [m, n]   digits: 1 or 2
// qa8_isa() -> the path in use: "avx512-vnni", "avx2" or "generic" (follows qgemm_set_isa / $INFRAGENT_ISA)
//
// The packed layout puts 16 weight rows side by side, so one vector instruction multiplies four activations
// into all 16 rows at once and each block's scale is applied to a whole vector of rows. Rows are grouped by
// 16 (G = ceil(n / 16) groups, the last padded with zero weights), and within a group block by block:
//   Q4_1: 4 units of 64 bytes per block. Unit u, byte 32h + 4r + i is the stored byte 4u + i of row 8h + r:
//         its low nibble is element 4u + i, its high nibble element 16 + 4u + i (the file's own bytes).
//   Q8_0: 8 units per block. Unit c, byte 32h + 4r + i is element 4c + i of row 8h + r, plus 128 (as uint8).
//   pd, pm: the block scales and mins as fp16 [G, blocks, 16], one per row of the group.
// As int32 lanes, a unit's 16 lanes are the group's 16 rows (AVX-512), or two halves of 8 (AVX2).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include <immintrin.h>

#include "isa.h"

namespace {

constexpr int64_t kGroup = 16;  // weight rows side by side
constexpr int kQ4 = 0, kQ8 = 1;  // the `kind` codes of qgemm.cpp

// The packed weight: nb blocks per row, `units` 64-byte units per block, G groups.
struct Packed {
  int kind;
  int64_t n, k, nb, groups;
  const uint8_t* w;        // [G, nb, units, 64]
  const _Float16* d;       // [G, nb, 16]
  const _Float16* m;       // [G, nb, 16] (Q4_1)
  const float* row_scale;  // [n] or null
  int64_t units() const { return kind == kQ4 ? 4 : 8; }
  const uint8_t* block(int64_t g, int64_t b) const { return w + (g * nb + b) * units() * 64; }
};

// One batch of activations, quantized: xq [m, k] int8 (and xq2, the second digit), and per row and block the
// scale of the block's integer sum xd, the sum of the fp32 activations xs (Q4_1's mins multiply it) and the
// sum of the integers xqs, digits weighted as in the product (Q8_0's +128 offset multiplies it).
struct Acts {
  int64_t m, k, nb;
  const int8_t* xq;
  const int8_t* xq2;  // null with one digit
  const int16_t* xj;  // the two digits joined, 128 q1 + q2 (AVX2's wide path), or null
  const float* xd;
  const float* xs;
  const int32_t* xqs;
};

// Where each of a block's weight vectors takes its four activations from: Q4_1's unit u holds elements
// 4u..4u+3 (low nibbles, vector 2u) and 16+4u.. (high nibbles, vector 2u+1); Q8_0's vector c, elements 4c...
inline int act_offset(int kind, int v) { return kind == kQ4 ? (v & 1) * 16 + 4 * (v >> 1) : 4 * v; }

inline int32_t dword(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// --- quantizing the activations: the same rounding on every path, so every path sees the same integers ---

inline void quantize_block_scalar(const float* x, int8_t* q, int8_t* q2, float* d, float* s, int32_t* qs) {
  float amax = 0, sum = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j])), sum += x[j];
  const float id = amax > 0 ? 127.0f / amax : 0.0f;
  int32_t qsum = 0, qsum2 = 0;
  for (int j = 0; j < 32; ++j) {
    const float t = x[j] * id, first = std::nearbyint(t);
    q[j] = static_cast<int8_t>(first);
    qsum += q[j];
    if (q2 != nullptr) {
      q2[j] = static_cast<int8_t>(std::nearbyint((t - first) * 128.0f));
      qsum2 += q2[j];
    }
  }
  *d = q2 != nullptr ? amax / 127.0f / 128.0f : amax / 127.0f, *s = sum;
  *qs = q2 != nullptr ? 128 * qsum + qsum2 : qsum;
}

namespace vnni {
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")

inline void quantize_block(const float* x, int8_t* q, int8_t* q2, float* d, float* s, int32_t* qs) {
  const __m512 a = _mm512_loadu_ps(x), b = _mm512_loadu_ps(x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
  const __m512 id = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
  const __m512 ta = _mm512_mul_ps(a, id), tb = _mm512_mul_ps(b, id);
  const __m512i qa = _mm512_cvtps_epi32(ta), qb = _mm512_cvtps_epi32(tb);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(qa));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtsepi32_epi8(qb));
  *d = amax / 127.0f;
  *s = _mm512_reduce_add_ps(_mm512_add_ps(a, b));
  *qs = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
  if (q2 != nullptr) {  // the remainder t - round(t) is exact in fp32; times 128 it is within [-64, 64]
    const __m512 k128 = _mm512_set1_ps(128.0f);
    const __m512i ra = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(ta, _mm512_cvtepi32_ps(qa)), k128));
    const __m512i rb = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(tb, _mm512_cvtepi32_ps(qb)), k128));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q2), _mm512_cvtsepi32_epi8(ra));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q2 + 16), _mm512_cvtsepi32_epi8(rb));
    *d /= 128.0f;
    *qs = 128 * *qs + _mm512_reduce_add_epi32(_mm512_add_epi32(ra, rb));
  }
}

// y rows a0..a0+A-1, group g: 16 rows per vector, four activations per vpdpbusd.
template <int Kind, int A, int Digits>
void group_tile(const Packed& w, const Acts& x, int64_t g, int64_t a0, float* y) {
  __m512 acc[A];
  for (int a = 0; a < A; ++a) acc[a] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(15);
  for (int64_t b = 0; b < w.nb; ++b) {
    const uint8_t* unit = w.block(g, b);
    __m512i wv[8];
    if (Kind == kQ4) {
      for (int u = 0; u < 4; ++u) {
        const __m512i v = _mm512_loadu_si512(unit + 64 * u);
        wv[2 * u] = _mm512_and_si512(v, low);
        wv[2 * u + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      }
    } else {
      for (int c = 0; c < 8; ++c) wv[c] = _mm512_loadu_si512(unit + 64 * c);
    }
    const __m512 wd = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.d + (g * w.nb + b) * 16)));
    __m512 wm = _mm512_setzero_ps();
    if (Kind == kQ4) wm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.m + (g * w.nb + b) * 16)));
    for (int a = 0; a < A; ++a) {
      const int64_t row = a0 + a;
      const int8_t* xb = x.xq + row * x.k + b * 32;
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int v = 0; v < 8; v += 2) {
        s0 = _mm512_dpbusd_epi32(s0, wv[v], _mm512_set1_epi32(dword(xb + act_offset(Kind, v))));
        s1 = _mm512_dpbusd_epi32(s1, wv[v + 1], _mm512_set1_epi32(dword(xb + act_offset(Kind, v + 1))));
      }
      __m512i s = _mm512_add_epi32(s0, s1);
      if (Digits == 2) {
        const int8_t* xb2 = x.xq2 + row * x.k + b * 32;
        __m512i t0 = _mm512_setzero_si512(), t1 = _mm512_setzero_si512();
        for (int v = 0; v < 8; v += 2) {
          t0 = _mm512_dpbusd_epi32(t0, wv[v], _mm512_set1_epi32(dword(xb2 + act_offset(Kind, v))));
          t1 = _mm512_dpbusd_epi32(t1, wv[v + 1], _mm512_set1_epi32(dword(xb2 + act_offset(Kind, v + 1))));
        }
        s = _mm512_add_epi32(_mm512_slli_epi32(s, 7), _mm512_add_epi32(t0, t1));
      }
      if (Kind == kQ8) s = _mm512_sub_epi32(s, _mm512_set1_epi32(128 * x.xqs[row * x.nb + b]));
      acc[a] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(wd, _mm512_set1_ps(x.xd[row * x.nb + b])), acc[a]);
      if (Kind == kQ4) acc[a] = _mm512_fmadd_ps(wm, _mm512_set1_ps(x.xs[row * x.nb + b]), acc[a]);
    }
  }
  const int64_t row0 = g * kGroup;
  const __mmask16 keep = static_cast<__mmask16>(row0 + kGroup <= w.n ? 0xFFFF : (1u << (w.n - row0)) - 1);
  const __m512 scale = w.row_scale != nullptr ? _mm512_maskz_loadu_ps(keep, w.row_scale + row0) : _mm512_set1_ps(1.0f);
  for (int a = 0; a < A; ++a) _mm512_mask_storeu_ps(y + (a0 + a) * w.n + row0, keep, _mm512_mul_ps(acc[a], scale));
}

#pragma GCC pop_options
}  // namespace vnni

namespace avx2 {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

inline float hmax8(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

inline float hsum8(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

inline int32_t hsum8i(__m256i v) {
  __m128i h = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(h, _mm_shuffle_epi32(h, 0xB1)));
}

// 32 int32 as int8, in element order (packs interleave 128-bit lanes; the permute puts them back).
inline void store_int8(int8_t* q, const __m256i* qi) {
  const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

inline int32_t sum_int(const __m256i* qi) {
  return hsum8i(_mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])));
}

inline void quantize_block(const float* x, int8_t* q, int8_t* q2, float* d, float* s, int32_t* qs) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], mx = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) v[j] = _mm256_loadu_ps(x + 8 * j), mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[j]));
  const float amax = hmax8(mx);
  const __m256 id = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
  __m256 t[4];
  __m256i qi[4];
  for (int j = 0; j < 4; ++j) t[j] = _mm256_mul_ps(v[j], id), qi[j] = _mm256_cvtps_epi32(t[j]);
  store_int8(q, qi);
  *d = amax / 127.0f;
  *s = hsum8(_mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3])));
  *qs = sum_int(qi);
  if (q2 != nullptr) {
    __m256i ri[4];
    for (int j = 0; j < 4; ++j)
      ri[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_sub_ps(t[j], _mm256_cvtepi32_ps(qi[j])), _mm256_set1_ps(128.0f)));
    store_int8(q2, ri);
    *d /= 128.0f;
    *qs = 128 * *qs + sum_int(ri);
  }
}

// Four u8 x s8 products per int32 lane, added to acc (maddubs pairs, then madd by ones sums the pairs).
inline __m256i dot4(__m256i acc, __m256i u, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

// w . x for one block's eight weight vectors against the activations at xb (one digit). Q8_0's stored w + 128
// would overflow maddubs's int16 pairs, so it runs as |w| times x with w's sign (at most 2 * 128 * 127).
template <int Kind>
inline __m256i block_sum(const __m256i* wv, const int8_t* xb) {
  if (Kind == kQ4) {  // nibbles: eight maddubs pairs (each at most 2 * 15 * 127) fit one int16 sum
    __m256i pairs = _mm256_setzero_si256();
    for (int v = 0; v < 8; ++v)
      pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(wv[v], _mm256_set1_epi32(dword(xb + act_offset(Kind, v)))));
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
  }
  __m256i s = _mm256_setzero_si256();
  for (int v = 0; v < 8; ++v) {
    const __m256i xv = _mm256_set1_epi32(dword(xb + act_offset(Kind, v)));
    s = dot4(s, _mm256_abs_epi8(wv[v]), _mm256_sign_epi8(xv, wv[v]));
  }
  return s;
}

// Rows a0.. of y for half h of group g (8 weight rows per vector), times the rows' scales where the weight has them.
template <int A>
void store_half(const Packed& w, const __m256* acc, int64_t g, int h, int64_t a0, float* y) {
  const int64_t row0 = g * kGroup + 8 * h;
  for (int a = 0; a < A; ++a) {
    float out[8];
    _mm256_storeu_ps(out, acc[a]);
    for (int r = 0; r < 8 && row0 + r < w.n; ++r)
      y[(a0 + a) * w.n + row0 + r] = out[r] * (w.row_scale != nullptr ? w.row_scale[row0 + r] : 1.0f);
  }
}

// As vnni::group_tile with 8 rows per vector: the group's two halves in turn (Q8_0 with two digits: wide_group).
template <int Kind, int A, int Digits>
void group_tile(const Packed& w, const Acts& x, int64_t g, int64_t a0, float* y) {
  const __m256i low = _mm256_set1_epi8(15), flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int h = 0; h < 2; ++h) {
    __m256 acc[A];
    for (int a = 0; a < A; ++a) acc[a] = _mm256_setzero_ps();
    for (int64_t b = 0; b < w.nb; ++b) {
      const uint8_t* unit = w.block(g, b) + 32 * h;
      // the next group's block, asked of memory while this one multiplies (see kAhead in qgemm_impl.h; on a Zen 3
      // batch 1's linears went from 6.3-6.8 to 5.5-6.0 ms; the same in widen_half did not pay)
      if (h == 0 && g + 1 < w.groups)
        for (int64_t u = 0; u < w.units(); ++u) __builtin_prefetch(w.block(g + 1, b) + 64 * u, 0, 0);
      __m256i wv[8];
      if (Kind == kQ4) {
        for (int u = 0; u < 4; ++u) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + 64 * u));
          wv[2 * u] = _mm256_and_si256(v, low);
          wv[2 * u + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        }
      } else {
        for (int c = 0; c < 8; ++c)
          wv[c] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + 64 * c)), flip);
      }
      const int64_t at = (g * w.nb + b) * 16 + 8 * h;
      const __m256 wd = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d + at)));
      __m256 wm = _mm256_setzero_ps();
      if (Kind == kQ4) wm = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.m + at)));
      for (int a = 0; a < A; ++a) {
        const int64_t row = a0 + a;
        __m256i s = block_sum<Kind>(wv, x.xq + row * x.k + b * 32);
        if (Digits == 2) s = _mm256_add_epi32(_mm256_slli_epi32(s, 7), block_sum<Kind>(wv, x.xq2 + row * x.k + b * 32));
        acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(wd, _mm256_set1_ps(x.xd[row * x.nb + b])), acc[a]);
        if (Kind == kQ4) acc[a] = _mm256_fmadd_ps(wm, _mm256_set1_ps(x.xs[row * x.nb + b]), acc[a]);
      }
    }
    store_half<A>(w, acc, g, h, a0, y);
  }
}

// Q8_0 with two digits (Q8_0's stored w + 128 would overflow maddubs's int16 pairs): the digits come joined
// into one int16 (xj = 128 q1 + q2, at most 16320 in magnitude, once per row) and a group half's weights are
// widened to int16 once per call, vector v of block b at w16[16 b + 2 v] (rows 0-3) and [16 b + 2 v + 1]
// (rows 4-7), so the inner loop is one broadcast per four activations and, per row and vector of weights,
// vpmaddwd + vpaddd. (Q4_1 measured slower this way: one maddubs already multiplies 32 nibbles by a digit.)
void widen_half(const Packed& w, int64_t g, int h, __m256i* w16) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < w.nb; ++b) {
    const uint8_t* unit = w.block(g, b) + 32 * h;
    __m256i* out = w16 + 16 * b;
    for (int v = 0; v < 8; ++v) {
      const __m256i wv = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(unit + 64 * v)), flip);
      _mm256_store_si256(out + 2 * v, _mm256_cvtepi8_epi16(_mm256_castsi256_si128(wv)));
      _mm256_store_si256(out + 2 * v + 1, _mm256_cvtepi8_epi16(_mm256_extracti128_si256(wv, 1)));
    }
  }
}

template <int A>
void wide_tile(const Packed& w, const Acts& x, const __m256i* w16, int64_t g, int h, int64_t a0, float* y) {
  __m256 acc[A];
  for (int a = 0; a < A; ++a) acc[a] = _mm256_setzero_ps();
  const int16_t* xrow[A];
  for (int a = 0; a < A; ++a) xrow[a] = x.xj + (a0 + a) * x.k;
  for (int64_t b = 0; b < w.nb; ++b) {
    const __m256i* wb = w16 + 16 * b;
    __m256i lo[A], hi[A];
    for (int a = 0; a < A; ++a) lo[a] = hi[a] = _mm256_setzero_si256();
    for (int v = 0; v < 8; ++v) {
      const __m256i wl = _mm256_load_si256(wb + 2 * v), wh = _mm256_load_si256(wb + 2 * v + 1);
      for (int a = 0; a < A; ++a) {
        int64_t four;
        std::memcpy(&four, xrow[a] + b * 32 + 4 * v, 8);  // Q8_0's vector v: elements 4v..4v+3
        const __m256i xv = _mm256_set1_epi64x(four);
        lo[a] = _mm256_add_epi32(lo[a], _mm256_madd_epi16(wl, xv));
        hi[a] = _mm256_add_epi32(hi[a], _mm256_madd_epi16(wh, xv));
      }
    }
    const int64_t at = (g * w.nb + b) * 16 + 8 * h;
    const __m256 wd = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.d + at)));
    for (int a = 0; a < A; ++a) {  // hadd leaves rows [0 1 4 5 | 2 3 6 7]; the permute restores their order
      const __m256i s = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(lo[a], hi[a]), _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
      const int64_t i = (a0 + a) * x.nb + b;
      acc[a] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(wd, _mm256_set1_ps(x.xd[i])), acc[a]);
    }
  }
  store_half<A>(w, acc, g, h, a0, y);
}

void wide_group(const Packed& w, const Acts& x, int64_t g, float* y) {
  static thread_local std::vector<int16_t> scratch;  // 16 vectors of 16 int16 per block, 32-byte aligned
  scratch.resize(256 * w.nb + 16);
  const uintptr_t start = (reinterpret_cast<uintptr_t>(scratch.data()) + 31) & ~uintptr_t{31};
  __m256i* w16 = reinterpret_cast<__m256i*>(start);
  constexpr int kRows = 4;
  for (int h = 0; h < 2; ++h) {
    widen_half(w, g, h, w16);
    int64_t a = 0;
    for (; a + kRows <= x.m; a += kRows) wide_tile<kRows>(w, x, w16, g, h, a, y);
    for (; a < x.m; ++a) wide_tile<1>(w, x, w16, g, h, a, y);
  }
}

#pragma GCC pop_options
}  // namespace avx2

namespace generic {

// The reference: the same integers and the same per-block scaling, one row and one lane at a time.
template <int Kind, int A, int Digits>
void group_tile(const Packed& w, const Acts& x, int64_t g, int64_t a0, float* y) {
  for (int a = 0; a < A; ++a) {
    const int64_t row = a0 + a;
    for (int lane = 0; lane < kGroup && g * kGroup + lane < w.n; ++lane) {
      const int h = lane / 8, r = lane % 8;
      float acc = 0;
      for (int64_t b = 0; b < w.nb; ++b) {
        const uint8_t* unit = w.block(g, b);
        const int8_t* xb = x.xq + row * x.k + b * 32;
        const int8_t* xb2 = Digits == 2 ? x.xq2 + row * x.k + b * 32 : nullptr;
        int32_t s = 0;
        for (int v = 0; v < 8; ++v)
          for (int i = 0; i < 4; ++i) {
            const uint8_t byte = Kind == kQ4 ? unit[64 * (v / 2) + 32 * h + 4 * r + i] : unit[64 * v + 32 * h + 4 * r + i];
            const int32_t q = Kind == kQ4 ? (v & 1 ? byte >> 4 : byte & 15) : static_cast<int32_t>(byte) - 128;
            const int at = act_offset(Kind, v) + i;
            s += q * (Digits == 2 ? 128 * xb[at] + xb2[at] : xb[at]);
          }
        const int64_t at = (g * w.nb + b) * 16 + lane;
        acc += static_cast<float>(s) * (static_cast<float>(w.d[at]) * x.xd[row * x.nb + b]);
        if (Kind == kQ4) acc += static_cast<float>(w.m[at]) * x.xs[row * x.nb + b];
      }
      const int64_t out = g * kGroup + lane;
      y[row * w.n + out] = acc * (w.row_scale != nullptr ? w.row_scale[out] : 1.0f);
    }
  }
}

}  // namespace generic

enum class Path { Generic, Avx2, Vnni };
const char* kPathNames[] = {"generic", "avx2", "avx512-vnni"};

Path path() {
  using infragent_isa::Isa;
  const Isa chosen = infragent_isa::isa();
  if (chosen == Isa::Avx512 && infragent_isa::has_vnni()) return Path::Vnni;
  return chosen == Isa::Generic ? Path::Generic : Path::Avx2;  // AVX-512 without VNNI runs the AVX2 path
}

void quantize_rows(const float* x, int64_t m, int64_t k, int8_t* xq, int8_t* xq2, float* xd, float* xs, int32_t* xqs,
                   Path p) {
  const int64_t nb = k / 32;
  at::parallel_for(0, m, std::max<int64_t>(1, 16384 / k), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t i = r * nb + b;
        const float* xb = x + r * k + b * 32;
        int8_t* qb = xq + r * k + b * 32;
        int8_t* qb2 = xq2 != nullptr ? xq2 + r * k + b * 32 : nullptr;
        if (p == Path::Vnni) vnni::quantize_block(xb, qb, qb2, xd + i, xs + i, xqs + i);
        else if (p == Path::Avx2) avx2::quantize_block(xb, qb, qb2, xd + i, xs + i, xqs + i);
        else quantize_block_scalar(xb, qb, qb2, xd + i, xs + i, xqs + i);
      }
  });
}

// Rows of x per tile: each group's weights are unpacked once per block and used for this many rows.
constexpr int kTile = 4;

void join_digits(const int8_t* q1, const int8_t* q2, int64_t count, int16_t* joined) {
  for (int64_t i = 0; i < count; ++i) joined[i] = static_cast<int16_t>(128 * q1[i] + q2[i]);
}

template <int Kind, int Digits>
void run_group(Path p, const Packed& w, const Acts& x, int64_t g, float* y) {
  if constexpr (Kind == kQ8 && Digits == 2)
    if (p == Path::Avx2 && x.xj != nullptr) return avx2::wide_group(w, x, g, y);
  int64_t a = 0;
  for (; a + kTile <= x.m; a += kTile) {
    if (p == Path::Vnni) vnni::group_tile<Kind, kTile, Digits>(w, x, g, a, y);
    else if (p == Path::Avx2) avx2::group_tile<Kind, kTile, Digits>(w, x, g, a, y);
    else generic::group_tile<Kind, kTile, Digits>(w, x, g, a, y);
  }
  for (; a < x.m; ++a) {
    if (p == Path::Vnni) vnni::group_tile<Kind, 1, Digits>(w, x, g, a, y);
    else if (p == Path::Avx2) avx2::group_tile<Kind, 1, Digits>(w, x, g, a, y);
    else generic::group_tile<Kind, 1, Digits>(w, x, g, a, y);
  }
}

Packed packed_of(const at::Tensor& packed, const at::Tensor& d, const at::Tensor& m, const std::optional<at::Tensor>& row_scale,
                 int64_t kind, int64_t n) {
  TORCH_CHECK(kind == kQ4 || kind == kQ8, "kind ", kind, ": 0 (Q4_1) or 1 (Q8_0)");
  TORCH_CHECK(packed.dim() == 4 && packed.is_contiguous() && packed.scalar_type() == at::kByte && packed.size(3) == 64 &&
                  packed.size(2) == (kind == kQ4 ? 4 : 8),
              "packed must be qpack_a8's uint8 [groups, blocks, units, 64]");
  const int64_t groups = packed.size(0), nb = packed.size(1);
  TORCH_CHECK(n > (groups - 1) * kGroup && n <= groups * kGroup, "n ", n, " does not fit ", groups, " groups of 16 rows");
  TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous() && d.numel() == groups * nb * kGroup, "pd must be fp16 [G, blocks, 16]");
  Packed w{static_cast<int>(kind), n, nb * 32, nb, groups, packed.data_ptr<uint8_t>(),
           reinterpret_cast<const _Float16*>(d.data_ptr()), nullptr, nullptr};
  if (kind == kQ4) {
    TORCH_CHECK(m.scalar_type() == at::kHalf && m.is_contiguous() && m.numel() == groups * nb * kGroup, "pm must be fp16 [G, blocks, 16]");
    w.m = reinterpret_cast<const _Float16*>(m.data_ptr());
  }
  if (row_scale.has_value()) {
    TORCH_CHECK(row_scale->scalar_type() == at::kFloat && row_scale->is_contiguous() && row_scale->numel() == n,
                "row_scale must be contiguous fp32 [n]");
    w.row_scale = row_scale->data_ptr<float>();
  }
  return w;
}

at::Tensor qlinear_a8(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& d, const at::Tensor& m,
                      const std::optional<at::Tensor>& row_scale, int64_t kind, int64_t n, int64_t digits) {
  const Packed w = packed_of(packed, d, m, row_scale, kind, n);
  TORCH_CHECK(digits == 1 || digits == 2, "digits ", digits, ": 1 or 2");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous fp32 [m, k]");
  TORCH_CHECK(x.size(1) == w.k, "x has ", x.size(1), " columns; the weight's rows have ", w.k);
  const int64_t rows = x.size(0);
  auto y = at::empty({rows, n}, x.options());
  if (rows == 0) return y;
  const Path p = path();
  // one scratch allocation for the quantized activations (five made a batch-1 call ~2 us slower): per row and
  // block xd, xs (fp32) and xqs (int32), then the digits (int8), then on AVX2's wide path the digits joined
  const bool wide = p == Path::Avx2 && kind == kQ8 && digits == 2;  // AVX2's wide_group: the digits joined
  const int64_t per_block = rows * w.nb;
  auto scratch = at::empty({per_block * 12 + rows * w.k * (digits + (wide ? 2 : 0))}, x.options().dtype(at::kByte));
  float* xd = reinterpret_cast<float*>(scratch.data_ptr<uint8_t>());
  float* xs = xd + per_block;
  int32_t* xqs = reinterpret_cast<int32_t*>(xs + per_block);
  int8_t* xq = reinterpret_cast<int8_t*>(xqs + per_block);
  int8_t* second = digits == 2 ? xq + rows * w.k : nullptr;
  quantize_rows(x.data_ptr<float>(), rows, w.k, xq, second, xd, xs, xqs, p);
  int16_t* joined = wide ? reinterpret_cast<int16_t*>(second + rows * w.k) : nullptr;
  if (wide) join_digits(xq, second, rows * w.k, joined);
  const Acts acts{rows, w.k, w.nb, xq, second, joined, xd, xs, xqs};
  float* yp = y.data_ptr<float>();
  // a task is at least ~32k multiply-adds per row of x: smaller products are not worth a second thread
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / (kGroup * w.k * std::min<int64_t>(rows, 8)));
  at::parallel_for(0, w.groups, grain, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      if (kind == kQ4) digits == 2 ? run_group<kQ4, 2>(p, w, acts, g, yp) : run_group<kQ4, 1>(p, w, acts, g, yp);
      else digits == 2 ? run_group<kQ8, 2>(p, w, acts, g, yp) : run_group<kQ8, 1>(p, w, acts, g, yp);
    }
  });
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> qpack_a8(const at::Tensor& qs, const at::Tensor& d,
                                                        const std::optional<at::Tensor>& mins, int64_t kind) {
  TORCH_CHECK(kind == kQ4 || kind == kQ8, "kind ", kind, ": 0 (Q4_1) or 1 (Q8_0)");
  TORCH_CHECK(qs.dim() == 2 && qs.is_contiguous() && qs.element_size() == 1, "qs must be contiguous 1-byte [n, bytes]");
  const int64_t n = qs.size(0), k = kind == kQ4 ? qs.size(1) * 2 : qs.size(1), nb = k / 32;
  TORCH_CHECK(k % 32 == 0, "row length ", k, " must be a multiple of 32 (one block)");
  TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous() && d.numel() == n * nb, "d must be contiguous fp16 [n, k / 32]");
  TORCH_CHECK(kind != kQ4 || (mins.has_value() && mins->scalar_type() == at::kHalf && mins->is_contiguous() &&
                              mins->numel() == n * nb),
              "mins must be contiguous fp16 [n, k / 32]");
  const int64_t groups = (n + kGroup - 1) / kGroup, units = kind == kQ4 ? 4 : 8;
  auto opts = qs.options().dtype(at::kByte);
  // padding rows are zero weights: Q4_1 d = m = 0; Q8_0 stores 128 (w = 0)
  auto packed = kind == kQ4 ? at::zeros({groups, nb, units, 64}, opts) : at::full({groups, nb, units, 64}, 128, opts);
  auto pd = at::zeros({groups, nb, kGroup}, d.options());
  auto pm = kind == kQ4 ? at::zeros({groups, nb, kGroup}, d.options()) : at::empty({0}, d.options());
  const uint8_t* src = reinterpret_cast<const uint8_t*>(qs.data_ptr());
  const uint16_t* ds = reinterpret_cast<const uint16_t*>(d.data_ptr());
  const uint16_t* ms = kind == kQ4 ? reinterpret_cast<const uint16_t*>(mins->data_ptr()) : nullptr;
  uint8_t* dst = packed.data_ptr<uint8_t>();
  uint16_t* pdp = reinterpret_cast<uint16_t*>(pd.data_ptr());
  uint16_t* pmp = kind == kQ4 ? reinterpret_cast<uint16_t*>(pm.data_ptr()) : nullptr;
  const int64_t row_bytes = qs.size(1), block_bytes = kind == kQ4 ? 16 : 32;
  for (int64_t row = 0; row < n; ++row) {
    const int64_t g = row / kGroup, lane = row % kGroup, h = lane / 8, r = lane % 8;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* from = src + row * row_bytes + b * block_bytes;
      uint8_t* to = dst + (g * nb + b) * units * 64 + 32 * h + 4 * r;
      for (int64_t u = 0; u < units; ++u)
        for (int i = 0; i < 4; ++i) to[64 * u + i] = kind == kQ4 ? from[4 * u + i] : static_cast<uint8_t>(from[4 * u + i] ^ 0x80);
      pdp[(g * nb + b) * kGroup + lane] = ds[row * nb + b];
      if (pmp != nullptr) pmp[(g * nb + b) * kGroup + lane] = ms[row * nb + b];
    }
  }
  return {packed, pd, pm};
}

std::string qa8_isa() { return kPathNames[static_cast<int>(path())]; }

}  // namespace

TORCH_LIBRARY_FRAGMENT(infragent, m) {
  m.def("qpack_a8(Tensor qs, Tensor d, Tensor? mins, int kind) -> (Tensor, Tensor, Tensor)");
  m.def("qlinear_a8(Tensor x, Tensor packed, Tensor pd, Tensor pm, Tensor? row_scale, int kind, int n, int digits=1) -> Tensor");
  m.def("qa8_isa() -> str", qa8_isa);
}

TORCH_LIBRARY_IMPL(infragent, CPU, m) {
  m.impl("qpack_a8", qpack_a8);
  m.impl("qlinear_a8", qlinear_a8);
}
