// Products with quantized weights kept in their stored blocks (GGUF Q4_1 and Q8_0, int8 per channel), fp32
// activations and fp32 accumulation, registered as torch.ops.infragent.*:
//
// qlinear(x [m, k], qs, d, mins, row_scale, kind) -> y [m, n]   (built for small m: decode batches)
// qdequantize(qs, d, mins, row_scale, kind, rows)  -> W [rows or n, k] fp32
// dense_linear(x [m, k], w [n, k] fp32)              -> y [m, n]   (the same products for a dense fp32 W)
// qgemm_isa() -> the instruction set in use;  qgemm_set_isa(name) -> choose one ("auto", "avx512", "avx2",
//   "generic"); the first use reads $INFRAGENT_ISA (default auto: the widest this CPU has).
//
// qgemm_impl.h is compiled three times into this one library, for AVX-512, AVX2 and the x86-64 baseline, so
// the same build runs on either machine kind and a test can run the AVX2 path on an AVX-512 machine.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <immintrin.h>

#include "isa.h"

namespace {

using infragent_isa::Isa;
using infragent_isa::isa;

enum class Kind : int64_t { Q4_1 = 0, Q8_0 = 1, I8 = 2, F32 = 3 };

namespace avx512 {
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
#define VEC 16
typedef float fvec __attribute__((vector_size(64)));

static inline fvec u8_to_f(const uint8_t* p, bool high) {
  __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  b = _mm_and_si128(high ? _mm_srli_epi16(b, 4) : b, _mm_set1_epi8(15));
  return reinterpret_cast<fvec>(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)));
}

static inline fvec s8_to_f(const int8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return reinterpret_cast<fvec>(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)));
}

static inline void halves_to_f(const _Float16* p, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i))));
  for (; i < n; ++i) out[i] = static_cast<float>(p[i]);
}

#include "qgemm_impl.h"
#undef VEC
#pragma GCC pop_options
}  // namespace avx512

namespace avx2 {
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define VEC 8
typedef float fvec __attribute__((vector_size(32)));

static inline fvec u8_to_f(const uint8_t* p, bool high) {
  __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  b = _mm_and_si128(high ? _mm_srli_epi16(b, 4) : b, _mm_set1_epi8(15));
  return reinterpret_cast<fvec>(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)));
}

static inline fvec s8_to_f(const int8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return reinterpret_cast<fvec>(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)));
}

// sum(q * x) over one Q4_1 block (16 bytes of nibbles at q, 32 activations at x). The 16 bytes are loaded once
// into both halves of a register and spread to one per int32 lane by in-lane byte shuffles, instead of two
// 8-byte loads and four lane-crossing widenings (vpmovzxbd). On a Zen 3 EPYC one core's batch-1 product of a
// cache-resident W went from ~2-3 to ~5 weights per cycle.
#define INFRAGENT_Q4_BLOCK_SUM 1
static inline fvec q4_block_sum(const uint8_t* q, const float* x) {
  const __m256i bytes = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  const __m256i low = _mm256_set1_epi8(15);
  const __m256i lo = _mm256_and_si256(bytes, low), hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
  const __m256i first = _mm256_setr_epi8(0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,
                                         4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1);
  const __m256i second = _mm256_setr_epi8(8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1,
                                          12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15, -1, -1, -1);
  __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, first)), _mm256_loadu_ps(x));
  __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, first)), _mm256_loadu_ps(x + 16));
  t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(lo, second)), _mm256_loadu_ps(x + 8), t);
  u = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(hi, second)), _mm256_loadu_ps(x + 24), u);
  return reinterpret_cast<fvec>(_mm256_add_ps(t, u));
}

static inline void halves_to_f(const _Float16* p, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i))));
  for (; i < n; ++i) out[i] = static_cast<float>(p[i]);
}

#include "qgemm_impl.h"
#undef INFRAGENT_Q4_BLOCK_SUM
#undef VEC
#pragma GCC pop_options
}  // namespace avx2

namespace generic {
#define VEC 4
typedef float fvec __attribute__((vector_size(16)));

static inline fvec u8_to_f(const uint8_t* p, bool high) {
  fvec v;
  for (int i = 0; i < VEC; ++i) v[i] = static_cast<float>(high ? p[i] >> 4 : p[i] & 15);
  return v;
}

static inline fvec s8_to_f(const int8_t* p) {
  fvec v;
  for (int i = 0; i < VEC; ++i) v[i] = static_cast<float>(p[i]);
  return v;
}

static inline void halves_to_f(const _Float16* p, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
}

#include "qgemm_impl.h"
#undef VEC
}  // namespace generic

template <typename W>
W weights(const at::Tensor& qs, const std::optional<at::Tensor>& d, const std::optional<at::Tensor>& mins,
          const std::optional<at::Tensor>& row_scale, int64_t kind_code) {
  TORCH_CHECK(kind_code >= 0 && kind_code <= 2, "kind ", kind_code, ": 0 (Q4_1), 1 (Q8_0) or 2 (int8)");
  const Kind kind = static_cast<Kind>(kind_code);
  TORCH_CHECK(qs.dim() == 2 && qs.is_contiguous() && qs.element_size() == 1, "qs must be contiguous 1-byte [n, bytes]");
  const int64_t n = qs.size(0), k = kind == Kind::Q4_1 ? qs.size(1) * 2 : qs.size(1);
  TORCH_CHECK(k % 32 == 0, "row length ", k, " must be a multiple of 32 (one block)");
  W w{kind, n, k, reinterpret_cast<const uint8_t*>(qs.data_ptr()), nullptr, nullptr, nullptr};
  if (kind != Kind::I8) {
    TORCH_CHECK(d.has_value() && d->scalar_type() == at::kHalf && d->is_contiguous() && d->numel() == n * (k / 32),
                "d must be contiguous fp16 [n, k / 32]");
    w.d = reinterpret_cast<const _Float16*>(d->data_ptr());
  }
  if (kind == Kind::Q4_1) {
    TORCH_CHECK(mins.has_value() && mins->scalar_type() == at::kHalf && mins->is_contiguous() &&
                    mins->numel() == n * (k / 32),
                "mins must be contiguous fp16 [n, k / 32]");
    w.m = reinterpret_cast<const _Float16*>(mins->data_ptr());
  }
  if (row_scale.has_value()) {
    TORCH_CHECK(row_scale->scalar_type() == at::kFloat && row_scale->is_contiguous() && row_scale->numel() == n,
                "row_scale must be contiguous fp32 [n]");
    w.row_scale = row_scale->data_ptr<float>();
  }
  return w;
}

#define INFRAGENT_ON_ISA(call)                                                              \
  switch (isa()) {                                                                         \
    case Isa::Avx512: { auto w = weights<avx512::Weights>(qs, d, mins, row_scale, kind); avx512::call; break; } \
    case Isa::Avx2: { auto w = weights<avx2::Weights>(qs, d, mins, row_scale, kind); avx2::call; break; }       \
    default: { auto w = weights<generic::Weights>(qs, d, mins, row_scale, kind); generic::call; break; }       \
  }

at::Tensor qlinear(const at::Tensor& x, const at::Tensor& qs, const std::optional<at::Tensor>& d,
                   const std::optional<at::Tensor>& mins, const std::optional<at::Tensor>& row_scale, int64_t kind) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous fp32 [m, k]");
  const int64_t k = static_cast<Kind>(kind) == Kind::Q4_1 ? qs.size(1) * 2 : qs.size(1);
  TORCH_CHECK(x.size(1) == k, "x has ", x.size(1), " columns; the weight's rows have ", k);
  auto y = at::empty({x.size(0), qs.size(0)}, x.options());
  if (x.size(0) == 0) return y;
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t m = x.size(0);
  INFRAGENT_ON_ISA(linear(w, xp, m, yp))
  return y;
}

at::Tensor qdequantize(const at::Tensor& qs, const std::optional<at::Tensor>& d, const std::optional<at::Tensor>& mins,
                       const std::optional<at::Tensor>& row_scale, int64_t kind, const std::optional<at::Tensor>& rows) {
  const int64_t k = static_cast<Kind>(kind) == Kind::Q4_1 ? qs.size(1) * 2 : qs.size(1);
  const int64_t* picked = nullptr;
  int64_t count = qs.size(0);
  if (rows.has_value()) {
    TORCH_CHECK(rows->scalar_type() == at::kLong && rows->is_contiguous() && rows->dim() == 1, "rows must be int64 [r]");
    picked = rows->data_ptr<int64_t>();
    count = rows->numel();
    for (int64_t i = 0; i < count; ++i)
      TORCH_CHECK(picked[i] >= 0 && picked[i] < qs.size(0), "row ", picked[i], " out of range [0, ", qs.size(0), ")");
  }
  auto out = at::empty({count, k}, qs.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  INFRAGENT_ON_ISA(dequantize(w, picked, count, op))
  return out;
}

at::Tensor dense_linear(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x must be contiguous fp32 [m, k]");
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.is_contiguous(), "w must be contiguous fp32 [n, k]");
  TORCH_CHECK(x.size(1) == w.size(1), "x has ", x.size(1), " columns; w's rows have ", w.size(1));
  TORCH_CHECK(w.size(1) % 32 == 0, "row length ", w.size(1), " must be a multiple of 32");
  auto y = at::empty({x.size(0), w.size(0)}, x.options());
  if (x.size(0) == 0) return y;
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t m = x.size(0), n = w.size(0), k = w.size(1);
  const auto* bytes = reinterpret_cast<const uint8_t*>(w.data_ptr());
  switch (isa()) {
    case Isa::Avx512: avx512::linear({Kind::F32, n, k, bytes, nullptr, nullptr, nullptr}, xp, m, yp); break;
    case Isa::Avx2: avx2::linear({Kind::F32, n, k, bytes, nullptr, nullptr, nullptr}, xp, m, yp); break;
    default: generic::linear({Kind::F32, n, k, bytes, nullptr, nullptr, nullptr}, xp, m, yp); break;
  }
  return y;
}

std::string qgemm_isa() { return infragent_isa::kIsaNames[static_cast<int>(isa())]; }

void qgemm_set_isa(const std::string& name) { infragent_isa::choose(name); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(infragent, m) {
  m.def("qlinear(Tensor x, Tensor qs, Tensor? d, Tensor? mins, Tensor? row_scale, int kind) -> Tensor");
  m.def("qdequantize(Tensor qs, Tensor? d, Tensor? mins, Tensor? row_scale, int kind, Tensor? rows) -> Tensor");
  m.def("dense_linear(Tensor x, Tensor w) -> Tensor");
  m.def("qgemm_isa() -> str", qgemm_isa);
  m.def("qgemm_set_isa(str name) -> ()", qgemm_set_isa);
}

TORCH_LIBRARY_IMPL(infragent, CPU, m) {
  m.impl("qlinear", qlinear);
  m.impl("qdequantize", qdequantize);
  m.impl("dense_linear", dense_linear);
}
