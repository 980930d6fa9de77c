// The quantized-weight products for one instruction set. qgemm.cpp includes this file once per ISA, each time
// inside its own namespace and under its own `#pragma GCC target`, with VEC (floats per vector) defined: the
// same source becomes AVX-512, AVX2 and baseline code in one build, chosen at run time.
//
// A weight W [N, K] is kept as the GGUF file stores it, row by row in blocks of 32 along K:
//   Q4_1: 16 bytes of nibbles per block (byte j: element j in its low nibble, element j + 16 in its high one),
//         an fp16 scale d and an fp16 min m per block: w = d * q + m, q in 0..15;
//   Q8_0: 32 int8 per block and an fp16 scale d: w = d * q;
//   I8:   int8 per element, no block scales (one fp32 scale per row, below);
//   F32:  fp32 per element (a dense weight: the same products without a dequantization, for the small-m
//         shapes this machine's BLAS runs far below its memory bandwidth).
// Any kind may carry an fp32 scale per output row (I8's channel scale; a folded constant such as the softmax
// scale of W_q), applied to each output. Activations and accumulation are fp32.

// The including file defines, for its ISA: fvec (VEC floats), u8_to_f(p, high) (VEC nibbles of the bytes at p,
// the low or the high ones, as floats), s8_to_f(p) (VEC int8 at p as floats) and halves_to_f(p, n, out) (n fp16
// at p as floats), with that ISA's widening instructions (GCC's generic vector conversions of bytes came out
// scalar); and, where it has a faster one, q4_block_sum(q, x) under INFRAGENT_Q4_BLOCK_SUM.

static inline fvec loadf(const float* p) {
  fvec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

static inline void storef(float* p, fvec v) { std::memcpy(p, &v, sizeof v); }

// The sum of a vector's lanes by halving: each step adds the upper half onto the lower (a loop over a lane
// array compiled to a branchy scalar loop, and the tile product takes eight sums per pass).
typedef float f4vec __attribute__((vector_size(16)));

static inline float hsum4(f4vec v) {
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2);
  return v[0];
}

#if VEC >= 8
typedef float f8vec __attribute__((vector_size(32)));

static inline float hsum8(f8vec v) {
  return hsum4(__builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7));
}
#endif

static inline float hsum(fvec v) {
#if VEC == 16
  return hsum8(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15));
#elif VEC == 8
  return hsum8(v);
#else
  return hsum4(v);
#endif
}

static inline float half(const _Float16* p) { return static_cast<float>(*p); }

// W's rows as raw pointers, and what they are made of.
struct Weights {
  Kind kind;
  int64_t n, k;
  const uint8_t* qs;       // Q4_1: [n, k / 2]; Q8_0, I8: [n, k] (int8); F32: [n, k] (fp32)
  const _Float16* d;       // [n, k / 32] (Q4_1, Q8_0)
  const _Float16* m;       // [n, k / 32] (Q4_1)
  const float* row_scale;  // [n] or null

  int64_t blocks() const { return k / 32; }
  int64_t row_bytes() const { return kind == Kind::Q4_1 ? k / 2 : kind == Kind::F32 ? k * 4 : k; }
  const float* dense_row(int64_t row) const { return reinterpret_cast<const float*>(qs) + row * k; }
  float scale_of(int64_t row) const { return row_scale != nullptr ? row_scale[row] : 1.0f; }
};

// One block of row `row` times the 32 activations at x: sum(q * x), the block's scale not applied (Q4_1's
// m * sum(x) is added by the caller, once per block from the activations' block sums).
template <Kind K>
static inline fvec block_sum(const Weights& w, int64_t row, int64_t b, const float* x) {
  // Two partial sums (the low nibbles' and the high ones'): two short chains through the FMA latency, not one.
  fvec t = fvec{}, u = fvec{};
  if (K == Kind::Q4_1) {
    const uint8_t* q = w.qs + row * (w.k / 2) + b * 16;
#ifdef INFRAGENT_Q4_BLOCK_SUM
    return q4_block_sum(q, x);  // this ISA's own (see the including file)
#else
    for (int j = 0; j < 16; j += VEC) {
      t += u8_to_f(q + j, false) * loadf(x + j);
      u += u8_to_f(q + j, true) * loadf(x + 16 + j);
    }
#endif
  } else if (K == Kind::F32) {
    const float* q = w.dense_row(row) + b * 32;
    for (int j = 0; j < 16; j += VEC) {
      t += loadf(q + j) * loadf(x + j);
      u += loadf(q + 16 + j) * loadf(x + 16 + j);
    }
  } else {
    const int8_t* q = reinterpret_cast<const int8_t*>(w.qs + row * w.k + b * 32);
    for (int j = 0; j < 16; j += VEC) {
      t += s8_to_f(q + j) * loadf(x + j);
      u += s8_to_f(q + 16 + j) * loadf(x + 16 + j);
    }
  }
  return t + u;
}

// sum(a[i] * b[i]) over n floats.
static inline float dot(const float* a, const float* b, int64_t n) {
  fvec acc = fvec{};
  int64_t i = 0;
  for (; i + VEC <= n; i += VEC) acc += loadf(a + i) * loadf(b + i);
  float sum = hsum(acc);
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Blocks whose fp16 scales (and Q4_1 mins) a GEMV converts to fp32 at a time, before their products: one
// vector conversion per 8 or 16 scales instead of a scalar one inside every block's product; on the stack
// (2048 elements of a row).
constexpr int64_t kScaleRun = 64;

// A decode step reads each weight once, from memory, not cache (the model's 97 MB pass through per token): the
// GEMV asks for the next four rows' bytes, a cache line at a time, while it multiplies these four. On a Zen 3
// EPYC (AVX2) this took the 30 MB Q8_0 LM head from 9.8 to 26-30 GB/s on 2 threads and all 121 linears of a step
// from ~10.4 to ~7 ms; prefetching 8 or 16 rows ahead, or into every cache level (locality 3), was slower.
constexpr int64_t kAhead = 4;

// y[row] for rows [r0, r1) of a single activation row x (batch 1): each block is dequantized in registers,
// four rows at a time so the activations loaded are shared; xsum holds x's sum per block (Q4_1's mins).
template <Kind K>
static void gemv_rows(const Weights& w, const float* x, const float* xsum, float* y, int64_t r0, int64_t r1) {
  constexpr bool scaled = K == Kind::Q4_1 || K == Kind::Q8_0;
  constexpr int64_t kBlockBytes = K == Kind::Q4_1 ? 16 : 32;
  const int64_t nb = w.blocks();
  float d[4][kScaleRun], m[4][kScaleRun];
  for (int64_t row = r0; row < r1; row += 4) {
    const int rows = static_cast<int>(std::min<int64_t>(4, r1 - row));
    fvec acc[4] = {};
    float mins[4] = {0, 0, 0, 0};
    for (int64_t b0 = 0; b0 < nb; b0 += kScaleRun) {
      const int64_t count = std::min(kScaleRun, nb - b0);
      for (int r = 0; r < rows && scaled; ++r) halves_to_f(w.d + (row + r) * nb + b0, count, d[r]);
      for (int r = 0; r < rows && K == Kind::Q4_1; ++r) {
        halves_to_f(w.m + (row + r) * nb + b0, count, m[r]);
        mins[r] += dot(m[r], xsum + b0, count);
      }
      const float* xb = x + b0 * 32;
      if (rows == 4) {
        for (int64_t b = 0; b < count; ++b) {
          const float* xs = xb + b * 32;
          if (((b0 + b) * kBlockBytes) % 64 == 0 && row + kAhead + 4 <= r1)
            for (int r = 0; r < 4; ++r)
              __builtin_prefetch(w.qs + (row + kAhead + r) * w.row_bytes() + (b0 + b) * kBlockBytes, 0, 0);
          if (scaled) {
            acc[0] += block_sum<K>(w, row, b0 + b, xs) * d[0][b];
            acc[1] += block_sum<K>(w, row + 1, b0 + b, xs) * d[1][b];
            acc[2] += block_sum<K>(w, row + 2, b0 + b, xs) * d[2][b];
            acc[3] += block_sum<K>(w, row + 3, b0 + b, xs) * d[3][b];
          } else {
            for (int r = 0; r < 4; ++r) acc[r] += block_sum<K>(w, row + r, b0 + b, xs);
          }
        }
      } else {
        for (int r = 0; r < rows; ++r)
          for (int64_t b = 0; b < count; ++b) {
            const fvec t = block_sum<K>(w, row + r, b0 + b, xb + b * 32);
            acc[r] += scaled ? t * d[r][b] : t;
          }
      }
    }
    for (int r = 0; r < rows; ++r) y[row + r] = (hsum(acc[r]) + mins[r]) * w.scale_of(row + r);
  }
}

static void gemv(const Weights& w, const float* x, const float* xsum, float* y, int64_t r0, int64_t r1) {
  switch (w.kind) {
    case Kind::Q4_1: gemv_rows<Kind::Q4_1>(w, x, xsum, y, r0, r1); break;
    case Kind::Q8_0: gemv_rows<Kind::Q8_0>(w, x, xsum, y, r0, r1); break;
    case Kind::F32: gemv_rows<Kind::F32>(w, x, xsum, y, r0, r1); break;
    default: gemv_rows<Kind::I8>(w, x, xsum, y, r0, r1); break;
  }
}

// y[row] for rows [r0, r1) of a dense W and one activation row: one row at a time, a single stream through
// memory (interleaving rows, as the tile product does, streamed W a third slower at one row on an EPYC), in
// the tile product's order of summation, so a row's output is the same alone or in a batch.
static void dense_gemv(const Weights& w, const float* x, float* y, int64_t r0, int64_t r1) {
  for (int64_t row = r0; row < r1; ++row) {
    const float* p = w.dense_row(row);
    fvec acc = fvec{};
    for (int64_t c = 0; c < w.k; c += VEC) acc += loadf(x + c) * loadf(p + c);
    y[row] = hsum(acc) * w.scale_of(row);
  }
}

// Row `row` of W dequantized into out[k] (fp32; the row scale is not applied).
static void dequantize_row(const Weights& w, int64_t row, float* out) {
  if (w.kind == Kind::F32) {
    std::memcpy(out, w.dense_row(row), w.k * sizeof(float));
    return;
  }
  const int64_t nb = w.blocks();
  for (int64_t b = 0; b < nb; ++b) {
    float* o = out + b * 32;
    if (w.kind == Kind::Q4_1) {
      const uint8_t* q = w.qs + row * w.row_bytes() + b * 16;
      const fvec d = fvec{} + half(w.d + row * nb + b), m = fvec{} + half(w.m + row * nb + b);
      for (int j = 0; j < 16; j += VEC) {
        storef(o + j, u8_to_f(q + j, false) * d + m);
        storef(o + 16 + j, u8_to_f(q + j, true) * d + m);
      }
    } else {
      const int8_t* q = reinterpret_cast<const int8_t*>(w.qs + row * w.row_bytes() + b * 32);
      const fvec d = fvec{} + (w.kind == Kind::I8 ? 1.0f : half(w.d + row * nb + b));
      for (int j = 0; j < 32; j += VEC) storef(o + j, s8_to_f(q + j) * d);
    }
  }
}

// Weight rows per pass of the tile product: AVX-512's 32 vector registers hold 4 x 4 accumulators and their
// operands (two activation loads per four products); AVX2's and the baseline's 16 hold 4 x 3 and three weights.
constexpr int kRowsPerPass = VEC == 16 ? 4 : 3;

// sums[a][j] = x row a . tile row j over k, for MI activation rows and RJ weight rows: MI x RJ accumulators,
// each vector loaded once per pass and used RJ (activations) or MI (weights) times.
template <int MI, int RJ>
static inline void micro(const float* x, const float* tile, int64_t k, float sums[4][kRowsPerPass]) {
  fvec acc[MI][RJ] = {};
  for (int64_t c = 0; c < k; c += VEC) {
    fvec wv[RJ];
    for (int j = 0; j < RJ; ++j) wv[j] = loadf(tile + j * k + c);
    for (int a = 0; a < MI; ++a) {
      const fvec xv = loadf(x + a * k + c);
      for (int j = 0; j < RJ; ++j) acc[a][j] += xv * wv[j];
    }
  }
  for (int a = 0; a < MI; ++a)
    for (int j = 0; j < RJ; ++j) sums[a][j] = hsum(acc[a][j]);
}

template <int RJ>
static inline void micro_rows(int mi, const float* x, const float* tile, int64_t k, float sums[4][kRowsPerPass]) {
  switch (mi) {
    case 4: micro<4, RJ>(x, tile, k, sums); break;
    case 3: micro<3, RJ>(x, tile, k, sums); break;
    case 2: micro<2, RJ>(x, tile, k, sums); break;
    default: micro<1, RJ>(x, tile, k, sums); break;
  }
}

// micro_rows<rj> for a run-time rj <= RJ (the last pass of a tile may hold fewer weight rows).
template <int RJ>
static inline void micro_pass(int rj, int mi, const float* x, const float* tile, int64_t k,
                              float sums[4][kRowsPerPass]) {
  if (rj == RJ) {
    micro_rows<RJ>(mi, x, tile, k, sums);
  } else if constexpr (RJ > 1) {
    micro_pass<RJ - 1>(rj, mi, x, tile, k, sums);
  }
}

// y[:, row0 + r] for every row of x [m, k] against `rows` dequantized W rows in tile ([rows, k], fp32), four
// activation rows by kRowsPerPass weight rows at a time.
static void tile_product(const float* x, int64_t m, int64_t k, const float* tile, int64_t rows, const Weights& w,
                         int64_t row0, float* y, int64_t ldy) {
  float sums[4][kRowsPerPass];
  // Dense rows come from memory, not from a dequantized tile in cache: each pass's rows go against every group
  // of activation rows while they are in L1, and up to four activation rows take one weight row per pass (one
  // stream through W, see dense_gemv; more rows are compute-bound, and take kRowsPerPass).
  const bool dense = w.kind == Kind::F32;
  const int64_t per_pass = dense && m <= 4 ? 1 : kRowsPerPass;
  auto pass = [&](int64_t i, int64_t r) {
    const int mi = static_cast<int>(std::min<int64_t>(4, m - i));
    const int rj = static_cast<int>(std::min<int64_t>(per_pass, rows - r));
    micro_pass<kRowsPerPass>(rj, mi, x + i * k, tile + r * k, k, sums);
    for (int a = 0; a < mi; ++a)
      for (int j = 0; j < rj; ++j) y[(i + a) * ldy + row0 + r + j] = sums[a][j] * w.scale_of(row0 + r + j);
  };
  if (dense) {
    for (int64_t r = 0; r < rows; r += per_pass)
      for (int64_t i = 0; i < m; i += 4) pass(i, r);
  } else {
    for (int64_t i = 0; i < m; i += 4)
      for (int64_t r = 0; r < rows; r += per_pass) pass(i, r);
  }
}

// y [m, n] = x [m, k] . W^T. Batch 1: the blocks are dequantized in registers, rows split over the threads.
// More rows: W is dequantized one tile of rows at a time into a buffer that stays in cache, and every row of
// x runs against it (the dequantization is paid once per tile, not once per activation row); a dense W's rows
// are the tile as they lie. Each output sums over k in the same order whatever m is.
static void linear(const Weights& w, const float* x, int64_t m, float* y) {
  const int64_t nb = w.blocks();
  if (m == 1 && w.kind == Kind::F32) {
    at::parallel_for(0, w.n, std::max<int64_t>(1, (1 << 16) / w.k), [&](int64_t r0, int64_t r1) {
      dense_gemv(w, x, y, r0, r1);
    });
    return;
  }
  if (m == 1) {
    std::vector<float> xsum(nb, 0.0f);
    if (w.kind == Kind::Q4_1)
      for (int64_t b = 0; b < nb; ++b) {
        fvec s = fvec{};
        for (int j = 0; j < 32; j += VEC) s += loadf(x + b * 32 + j);
        xsum[b] = hsum(s);
      }
    const int64_t groups = (w.n + 3) / 4;
    at::parallel_for(0, groups, std::max<int64_t>(1, (1 << 16) / (4 * w.k)), [&](int64_t g0, int64_t g1) {
      gemv(w, x, xsum.data(), y, g0 * 4, std::min(w.n, g1 * 4));
    });
    return;
  }
  constexpr int64_t kTile = 16;
  at::parallel_for(0, (w.n + kTile - 1) / kTile, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> tile(w.kind == Kind::F32 ? 0 : kTile * w.k);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t row0 = t * kTile, rows = std::min(kTile, w.n - row0);
      if (w.kind == Kind::F32) {
        tile_product(x, m, w.k, w.dense_row(row0), rows, w, row0, y, w.n);
        continue;
      }
      for (int64_t r = 0; r < rows; ++r) dequantize_row(w, row0 + r, tile.data() + r * w.k);
      tile_product(x, m, w.k, tile.data(), rows, w, row0, y, w.n);
    }
  });
}

// out [count, k] = W's rows `rows` (all rows when null) dequantized, each times its row scale.
static void dequantize(const Weights& w, const int64_t* rows, int64_t count, float* out) {
  at::parallel_for(0, count, std::max<int64_t>(1, (1 << 15) / w.k), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t row = rows != nullptr ? rows[i] : i;
      float* o = out + i * w.k;
      dequantize_row(w, row, o);
      if (w.row_scale != nullptr) {
        const fvec s = fvec{} + w.row_scale[row];
        for (int64_t c = 0; c < w.k; c += VEC) storef(o + c, loadf(o + c) * s);
      }
    }
  });
}
