// Vector helpers shared by the native kernels: GCC vector types, lowered to whatever SIMD -march=native has.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace infragent {

// Sixteen floats as one GCC vector: the compiler lowers it to whatever SIMD the CPU has (-march=native):
// one AVX-512 register, or two AVX2 ones.
typedef float vec16 __attribute__((vector_size(64)));
typedef int32_t ivec16 __attribute__((vector_size(64)));

inline vec16 load16(const float* p) {
  vec16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline void store16(float* p, vec16 v) { std::memcpy(p, &v, sizeof v); }

// bf16 storage (a KV cache in bf16): the sixteen values widened to fp32, whose upper halves they are.
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

inline vec16 load16(const uint16_t* p) {
  u16x16 half;
  std::memcpy(&half, p, sizeof half);
  const u32x16 bits = __builtin_convertvector(half, u32x16) << 16;
  vec16 v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// int8 storage (a scaled KV cache): the sixteen values as fp32, before their scale.
typedef int8_t i8x16 __attribute__((vector_size(16)));

inline vec16 load16(const int8_t* p) {
  i8x16 q;
  std::memcpy(&q, p, sizeof q);
  return __builtin_convertvector(q, vec16);
}

// fp32 -> bf16 rounded to nearest even (the bits torch's .to(torch.bfloat16) gives); a NaN stays a NaN.
inline uint16_t to_bf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline void store_row(float* dst, const float* src, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
inline void store_row(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

// The sum of the sixteen lanes, as a tree of four shuffles and adds (a lane-by-lane sum is a 16-add chain).
inline float hsum(vec16 v) {
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return v[0];
}

// exp(x) for x <= 0, as softmax needs after subtracting the max: x = n ln2 + r, |r| <= ln2/2, e^r by its
// degree-7 Taylor polynomial (relative error < 2e-8 on that range), 2^n built in the exponent bits.
inline vec16 exp_nonpositive(vec16 x) {
  const vec16 floor_value = vec16{} - 87.0f;
  x = x < floor_value ? floor_value : x;
  const ivec16 whole = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, ivec16);  // round: x <= 0
  const vec16 n = __builtin_convertvector(whole, vec16);
  const vec16 r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  vec16 p = vec16{} + 1.f / 5040.f;
  p = p * r + 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const ivec16 bits = (whole + 127) << 23;
  vec16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

// The largest of s[0, len): a vector max over whole groups of sixteen, then the rest.
inline float max_of(const float* s, int64_t len) {
  float top = s[0];
  int64_t t = 0;
  if (len >= 16) {
    vec16 m = load16(s);
    for (t = 16; t + 16 <= len; t += 16) {
      const vec16 x = load16(s + t);
      m = x > m ? x : m;
    }
    for (int i = 0; i < 16; ++i) top = std::max(top, m[i]);
  }
  for (; t < len; ++t) top = std::max(top, s[t]);
  return top;
}

// exp(s - max(s)) over s[0, len) in place: the softmax before its normalization, whose factor (1 / the sum)
// is returned so the caller can apply it once to what it computes from these weights.
inline float softmax_unnormalized(float* s, int64_t len) {
  const float top = max_of(s, len);
  vec16 total = vec16{};
  int64_t t = 0;
  for (; t + 16 <= len; t += 16) {
    const vec16 e = exp_nonpositive(load16(s + t) - top);
    store16(s + t, e);
    total += e;
  }
  float sum = hsum(total);
  if (t < len) {
    float tail[16];
    std::fill(tail, tail + 16, -100.f);
    std::copy(s + t, s + len, tail);
    const vec16 e = exp_nonpositive(load16(tail) - top);
    for (int64_t i = 0; t + i < len; ++i) {
      s[t + i] = e[i];
      sum += e[i];
    }
  }
  return 1.f / sum;
}

}  // namespace infragent
