// Decode-time attention kernels for the paged KV cache (fp32 math; the cache in fp32, bf16, or int8 with one
// scale per block and kv head), registered as torch.ops.infragent.*.
//
// rope_and_cache_: rotate the q and k heads of a step's fused qkv rows in place (NeoX rotate-half) and
//   write each row's k and v heads into its cache slot (block, offset).
// paged_decode_attention: one query row per sequence attends over its own blocks, read in place from
//   the cache (no gather), with the exact context length (no padding mask). GQA: query head h reads
//   kv head h / (heads / kv_heads). An int8 cache comes with its scales: a block's scores are its integer
//   dot products times the key scale, and its values weigh in times the value scale.
// Work splits over (sequence, kv head) pairs with at::parallel_for, torch's own thread pool.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "vec.h"
#include "slots.h"

namespace {

using namespace infragent;

void check_caches(const at::Tensor& k_cache, const at::Tensor& v_cache) {
  for (const at::Tensor* cache : {&k_cache, &v_cache})
    TORCH_CHECK(cache->dim() == 4 && cache->is_contiguous() &&
                (cache->scalar_type() == at::kFloat || cache->scalar_type() == at::kBFloat16),
                "the K and V caches must be contiguous fp32 or bf16 [blocks, kv_heads, block_size, head_dim], got ",
                cache->scalar_type(), " ", cache->sizes());
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.scalar_type() == v_cache.scalar_type(),
              "k_cache and v_cache differ in shape or dtype");
}

// The cache's elements as stored: float, or bf16 bits.
template <typename T>
T* elements(const at::Tensor& cache) {
  return reinterpret_cast<T*>(cache.data_ptr());
}

template <typename T>
void rope_and_store(const at::Tensor& qkv, const float* cos_p, const float* sin_p, T* kc, T* vc,
                    const int64_t* blocks, const int64_t* offsets, int64_t num_heads, int64_t kv_heads,
                    int64_t block_size, int64_t dim) {
  const int64_t tokens = qkv.size(0), half = dim / 2;
  float* rows = qkv.data_ptr<float>();
  const int64_t row_stride = qkv.stride(0), rotated = num_heads + kv_heads;
  const int64_t grain = std::max<int64_t>(1, 64 / rotated);
  at::parallel_for(0, tokens, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> x(dim);
    for (int64_t t = begin; t < end; ++t) {
      float* row = rows + t * row_stride;
      const float* c = cos_p + t * dim;
      const float* s = sin_p + t * dim;
      for (int64_t h = 0; h < rotated; ++h) {
        float* head = row + h * dim;
        std::memcpy(x.data(), head, dim * sizeof(float));
        for (int64_t i = 0; i < half; ++i) head[i] = x[i] * c[i] + x[i + half] * s[i];
        for (int64_t i = half; i < dim; ++i) head[i] = x[i] * c[i] + x[i - half] * s[i];
      }
      for (int64_t h = 0; h < kv_heads && kc != nullptr; ++h) {  // no cache: rotate only
        const int64_t slot = ((blocks[t] * kv_heads + h) * block_size + offsets[t]) * dim;
        store_row(kc + slot, row + (num_heads + h) * dim, dim);
        store_row(vc + slot, row + (rotated + h) * dim, dim);
      }
    }
  });
}

void rope_and_cache_(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                     const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& slot_blocks,
                     const at::Tensor& slot_offsets, int64_t num_heads) {
  check_caches(k_cache, v_cache);
  const int64_t tokens = qkv.size(0), kv_heads = k_cache.size(1), block_size = k_cache.size(2);
  const int64_t dim = k_cache.size(3), num_blocks = k_cache.size(0);
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.stride(1) == 1 &&
              qkv.size(1) == (num_heads + 2 * kv_heads) * dim, "qkv must be fp32 [tokens, (heads + 2 kv_heads) * head_dim]");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
              sin.is_contiguous() && cos.numel() == tokens * dim && sin.numel() == tokens * dim,
              "cos and sin must be contiguous fp32 with head_dim values per token");
  check_slots(slot_blocks, slot_offsets, tokens, num_blocks, block_size);
  const int64_t* blocks = slot_blocks.data_ptr<int64_t>();
  const int64_t* offsets = slot_offsets.data_ptr<int64_t>();
  if (k_cache.scalar_type() == at::kFloat)
    rope_and_store(qkv, cos.data_ptr<float>(), sin.data_ptr<float>(), elements<float>(k_cache),
                   elements<float>(v_cache), blocks, offsets, num_heads, kv_heads, block_size, dim);
  else
    rope_and_store(qkv, cos.data_ptr<float>(), sin.data_ptr<float>(), elements<uint16_t>(k_cache),
                   elements<uint16_t>(v_cache), blocks, offsets, num_heads, kv_heads, block_size, dim);
}

// RoPE alone on fused qkv rows (an int8 cache stores them afterwards with their scales: scaled_kv_write_).
void rope_(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin, int64_t num_heads, int64_t kv_heads) {
  const int64_t tokens = qkv.size(0), width = num_heads + 2 * kv_heads;
  TORCH_CHECK(qkv.dim() == 2 && qkv.scalar_type() == at::kFloat && qkv.stride(1) == 1 && qkv.size(1) % width == 0,
              "qkv must be fp32 [tokens, (heads + 2 kv_heads) * head_dim]");
  const int64_t dim = qkv.size(1) / width;
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
              sin.is_contiguous() && cos.numel() == tokens * dim && sin.numel() == tokens * dim,
              "cos and sin must be contiguous fp32 with head_dim values per token");
  rope_and_store<float>(qkv, cos.data_ptr<float>(), sin.data_ptr<float>(), nullptr, nullptr, nullptr, nullptr,
                        num_heads, kv_heads, 0, dim);
}

template <typename T>
struct Cache {
  const T* k;
  const T* v;
  int64_t kv_heads, block_size;
  const float* k_scale = nullptr;  // int8: [blocks, kv_heads]
  const float* v_scale = nullptr;
  static constexpr bool kScaled = std::is_same_v<T, int8_t>;

  // The scale of the block holding row `first` of kv head h (int8), for keys (which = 0) or values.
  float scale(const int64_t* blocks, int64_t first, int64_t h, int which) const {
    return (which == 0 ? k_scale : v_scale)[blocks[first / block_size] * kv_heads + h];
  }

  // Rows [first, first + block_size) of kv head h of a sequence whose block table is blocks, as
  // [block_size, head_dim]: one contiguous run.
  const T* keys(const int64_t* blocks, int64_t first, int64_t h, int64_t dim) const {
    return k + (blocks[first / block_size] * kv_heads + h) * block_size * dim;
  }
  const T* values(const int64_t* blocks, int64_t first, int64_t h, int64_t dim) const {
    return v + (blocks[first / block_size] * kv_heads + h) * block_size * dim;
  }
};

// The group of query rows [G, head_dim] that share kv head h attends over len tokens of one sequence.
// G and C (= head_dim / 16) are compile-time for the common shapes, so the query rows and the output
// accumulators stay in registers and each key or value row is loaded once for the whole group;
// G = C = 0 is the general case, the same arithmetic with runtime sizes.
template <typename T, int G, int C>
void attend_kv_head(const float* query, float* output, const Cache<T>& cache, const int64_t* blocks, int64_t len,
                    int64_t h, int64_t group_rt, int64_t dim_rt, float* scores) {
  const int64_t group = G ? G : group_rt, dim = C ? C * 16 : dim_rt, bs = cache.block_size;
  if constexpr (G > 0 && C > 0) {
    vec16 q[G][C];
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c) q[g][c] = load16(query + g * dim + c * 16);
    for (int64_t first = 0; first < len; first += bs) {
      const T* keys = cache.keys(blocks, first, h, dim);
      const float ks = Cache<T>::kScaled ? cache.scale(blocks, first, h, 0) : 1.0f;
      for (int64_t t = 0; t < std::min(bs, len - first); ++t) {
        vec16 key[C];
        for (int c = 0; c < C; ++c) key[c] = load16(keys + t * dim + c * 16);
        for (int g = 0; g < G; ++g) {
          vec16 acc = q[g][0] * key[0];
          for (int c = 1; c < C; ++c) acc += q[g][c] * key[c];
          scores[g * len + first + t] = Cache<T>::kScaled ? hsum(acc) * ks : hsum(acc);
        }
      }
    }
  } else {
    for (int64_t first = 0; first < len; first += bs) {
      const T* keys = cache.keys(blocks, first, h, dim);
      const float ks = Cache<T>::kScaled ? cache.scale(blocks, first, h, 0) : 1.0f;
      for (int64_t t = 0; t < std::min(bs, len - first); ++t) {
        for (int64_t g = 0; g < group; ++g) {
          vec16 acc = load16(query + g * dim) * load16(keys + t * dim);
          for (int64_t i = 16; i < dim; i += 16) acc += load16(query + g * dim + i) * load16(keys + t * dim + i);
          scores[g * len + first + t] = Cache<T>::kScaled ? hsum(acc) * ks : hsum(acc);
        }
      }
    }
  }
  if constexpr (G > 0 && C > 0) {
    float norm[G];  // 1 / each query row's softmax sum, applied to its output once at the end
    for (int g = 0; g < G; ++g) norm[g] = softmax_unnormalized(scores + g * len, len);
    vec16 acc[G][C] = {};
    for (int64_t first = 0; first < len; first += bs) {
      const T* values = cache.values(blocks, first, h, dim);
      const float vs = Cache<T>::kScaled ? cache.scale(blocks, first, h, 1) : 1.0f;
      for (int64_t t = 0; t < std::min(bs, len - first); ++t) {
        vec16 value[C];
        for (int c = 0; c < C; ++c) value[c] = load16(values + t * dim + c * 16);
        for (int g = 0; g < G; ++g) {
          const float p = Cache<T>::kScaled ? scores[g * len + first + t] * vs : scores[g * len + first + t];
          for (int c = 0; c < C; ++c) acc[g][c] += p * value[c];
        }
      }
    }
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c) store16(output + g * dim + c * 16, acc[g][c] * norm[g]);
  } else {  // accumulators in memory, token by token: the (row, lane) chains are independent
    for (int64_t g = 0; g < group; ++g) {
      const float norm = softmax_unnormalized(scores + g * len, len);
      for (int64_t t = 0; t < len; ++t) scores[g * len + t] *= norm;
    }
    std::fill(output, output + group * dim, 0.f);
    for (int64_t first = 0; first < len; first += bs) {
      const T* values = cache.values(blocks, first, h, dim);
      const float vs = Cache<T>::kScaled ? cache.scale(blocks, first, h, 1) : 1.0f;
      for (int64_t t = 0; t < std::min(bs, len - first); ++t) {
        for (int64_t g = 0; g < group; ++g) {
          const float p = Cache<T>::kScaled ? scores[g * len + first + t] * vs : scores[g * len + first + t];
          float* out = output + g * dim;
          for (int64_t i = 0; i < dim; i += 16) store16(out + i, load16(out + i) + p * load16(values + t * dim + i));
        }
      }
    }
  }
}

// Every (sequence, kv head) item of the batch, split over torch's thread pool.
template <typename T>
void attend_all(const at::Tensor& q, at::Tensor& out, const Cache<T>& cache, const int64_t* table, int64_t width,
                const int64_t* lens) {
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2), kv_heads = cache.kv_heads;
  const int64_t group = heads / kv_heads, q_stride = q.stride(0);
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  // the common shapes get the accumulators in registers: (group, head_dim / 16) known at compile time
  auto attend = group == 3 && dim == 64 ? attend_kv_head<T, 3, 4>
              : group == 4 && dim == 64 ? attend_kv_head<T, 4, 4>
              : group == 1 && dim == 64 ? attend_kv_head<T, 1, 4>
              : group == 2 && dim == 64 ? attend_kv_head<T, 2, 4>
              : attend_kv_head<T, 0, 0>;
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / kv_heads, h = item % kv_heads;
      scores.resize(group * lens[b]);
      attend(qp + b * q_stride + h * group * dim, op + (b * heads + h * group) * dim, cache, table + b * width,
             lens[b], h, group, dim, scores.data());
    }
  });
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                                  const at::Tensor& block_table, const at::Tensor& context_lens,
                                  const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale) {
  const bool scaled = k_cache.scalar_type() == at::kChar;
  if (!scaled) check_caches(k_cache, v_cache);
  const int64_t batch = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t num_blocks = k_cache.size(0), kv_heads = k_cache.size(1), block_size = k_cache.size(2);
  TORCH_CHECK(q.dim() == 3 && q.scalar_type() == at::kFloat && q.stride(2) == 1 && q.stride(1) == dim &&
              dim == k_cache.size(3) && heads % kv_heads == 0 &&
              dim % 16 == 0, "q must be fp32 [batch, heads, head_dim] with contiguous heads, heads a multiple "
              "of kv_heads and head_dim a multiple of 16");
  TORCH_CHECK(block_table.dim() == 2 && block_table.scalar_type() == at::kLong && block_table.is_contiguous() &&
              block_table.size(0) == batch, "block_table must be contiguous int64 [batch, blocks]");
  TORCH_CHECK(context_lens.scalar_type() == at::kLong && context_lens.is_contiguous() &&
              context_lens.numel() == batch, "context_lens must be contiguous int64 [batch]");
  const int64_t width = block_table.size(1);
  const int64_t* table = block_table.data_ptr<int64_t>();
  const int64_t* lens = context_lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(lens[b] >= 1 && lens[b] <= width * block_size, "context length ", lens[b], " of row ", b,
                " does not fit its ", width, " blocks of ", block_size);
    for (int64_t j = 0; j < (lens[b] + block_size - 1) / block_size; ++j)
      TORCH_CHECK(table[b * width + j] >= 0 && table[b * width + j] < num_blocks, "block ",
                  table[b * width + j], " of row ", b, " is outside the cache");
  }
  auto out = at::empty({batch, heads, dim}, q.options());
  if (scaled) {
    TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() &&
                v_cache.scalar_type() == at::kChar && v_cache.is_contiguous(),
                "int8 K and V caches must be contiguous and of one shape [blocks, kv_heads, block_size, head_dim]");
    for (const auto* s : {&k_scale, &v_scale})
      TORCH_CHECK(s->has_value() && (*s)->scalar_type() == at::kFloat && (*s)->is_contiguous() &&
                  (*s)->numel() == num_blocks * kv_heads, "an int8 cache needs k_scale and v_scale: contiguous fp32 "
                  "[blocks, kv_heads]");
    Cache<int8_t> cache{k_cache.data_ptr<int8_t>(), v_cache.data_ptr<int8_t>(), kv_heads, block_size,
                        k_scale->data_ptr<float>(), v_scale->data_ptr<float>()};
    attend_all(q, out, cache, table, width, lens);
  } else if (k_cache.scalar_type() == at::kFloat)
    attend_all(q, out, Cache<float>{elements<float>(k_cache), elements<float>(v_cache), kv_heads, block_size},
               table, width, lens);
  else
    attend_all(q, out, Cache<uint16_t>{elements<uint16_t>(k_cache), elements<uint16_t>(v_cache), kv_heads,
                                       block_size}, table, width, lens);
  return out;
}

}  // namespace

TORCH_LIBRARY(infragent, m) {
  m.def("rope_and_cache_(Tensor(a!) qkv, Tensor cos, Tensor sin, Tensor(b!) k_cache, Tensor(c!) v_cache, "
        "Tensor slot_blocks, Tensor slot_offsets, int num_heads) -> ()");
  m.def("rope_(Tensor(a!) qkv, Tensor cos, Tensor sin, int num_heads, int kv_heads) -> ()");
  m.def("paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, "
        "Tensor context_lens, Tensor? k_scale=None, Tensor? v_scale=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(infragent, CPU, m) {
  m.impl("rope_and_cache_", rope_and_cache_);
  m.impl("rope_", rope_);
  m.impl("paged_decode_attention", paged_decode_attention);
}
