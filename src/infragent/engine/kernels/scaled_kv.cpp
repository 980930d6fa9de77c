// Writing K or V rows into an int8 KV cache with one scale per (block, kv head), registered as
// torch.ops.infragent.scaled_kv_write_. The same integers and scales as quant/kv_quant.write_scaled (the
// reference): a row at offset 0 starts its block afresh (scale 0); every block a step touches gets
// scale = max(its scale, amax of the step's rows in it / 127) per head; a block whose scale grew has its
// earlier rows re-encoded to the new scale (one more rounding); then the rows are stored as
// round(x / scale) in [-127, 127] (nearest even, as torch's round). An all-zero head keeps scale 1.
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "slots.h"

namespace {

using infragent::check_slots;

inline int8_t encode(float x) { return static_cast<int8_t>(std::clamp(std::nearbyint(x), -127.0f, 127.0f)); }

void scaled_kv_write_(const at::Tensor& cache, const at::Tensor& scale, const at::Tensor& slot_blocks,
                      const at::Tensor& slot_offsets, const at::Tensor& rows) {
  TORCH_CHECK(cache.dim() == 4 && cache.is_contiguous() && cache.scalar_type() == at::kChar,
              "cache must be contiguous int8 [blocks, kv_heads, block_size, head_dim]");
  const int64_t num_blocks = cache.size(0), heads = cache.size(1), block_size = cache.size(2), dim = cache.size(3);
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == num_blocks * heads,
              "scale must be contiguous fp32 [blocks, kv_heads]");
  TORCH_CHECK(rows.dim() == 3 && rows.scalar_type() == at::kFloat && rows.size(1) == heads && rows.size(2) == dim &&
              rows.stride(2) == 1, "rows must be fp32 [tokens, kv_heads, head_dim] with contiguous heads");
  const int64_t tokens = rows.size(0);
  check_slots(slot_blocks, slot_offsets, tokens, num_blocks, block_size);
  const int64_t* blocks = slot_blocks.data_ptr<int64_t>();
  const int64_t* offsets = slot_offsets.data_ptr<int64_t>();
  int8_t* data = cache.data_ptr<int8_t>();
  float* sc = scale.data_ptr<float>();
  const float* x = rows.data_ptr<float>();
  const int64_t row_stride = rows.stride(0), head_stride = rows.stride(1);
  auto row = [&](int64_t t, int64_t h) { return x + t * row_stride + h * head_stride; };

  for (int64_t t = 0; t < tokens; ++t)
    if (offsets[t] == 0) std::fill(sc + blocks[t] * heads, sc + (blocks[t] + 1) * heads, 0.0f);
  std::vector<int64_t> touched(blocks, blocks + tokens);  // each block once, in order
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  std::vector<float> needed(touched.size() * heads, 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t i = std::lower_bound(touched.begin(), touched.end(), blocks[t]) - touched.begin();
    for (int64_t h = 0; h < heads; ++h) {
      float amax = 0.0f;
      for (int64_t j = 0; j < dim; ++j) amax = std::max(amax, std::fabs(row(t, h)[j]));
      needed[i * heads + h] = std::max(needed[i * heads + h], amax);
    }
  }
  for (size_t i = 0; i < touched.size(); ++i) {
    float* s = sc + touched[i] * heads;
    std::vector<float> fresh(heads);
    bool grown = false;
    for (int64_t h = 0; h < heads; ++h) {
      fresh[h] = std::max(s[h], needed[i * heads + h] / 127.0f);
      grown = grown || (s[h] > 0 && fresh[h] > s[h]);
    }
    if (grown)
      for (int64_t h = 0; h < heads; ++h) {
        const float ratio = s[h] / fresh[h];
        int8_t* q = data + (touched[i] * heads + h) * block_size * dim;
        for (int64_t j = 0; j < block_size * dim; ++j) q[j] = encode(static_cast<float>(q[j]) * ratio);
      }
    for (int64_t h = 0; h < heads; ++h) s[h] = fresh[h] > 0 ? fresh[h] : 1.0f;
  }
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float s = sc[blocks[t] * heads + h];
      int8_t* q = data + ((blocks[t] * heads + h) * block_size + offsets[t]) * dim;
      for (int64_t j = 0; j < dim; ++j) q[j] = encode(row(t, h)[j] / s);
    }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(infragent, m) {
  m.def("scaled_kv_write_(Tensor(a!) cache, Tensor(b!) scale, Tensor slot_blocks, Tensor slot_offsets, "
        "Tensor rows) -> ()");
}

TORCH_LIBRARY_IMPL(infragent, CPU, m) { m.impl("scaled_kv_write_", scaled_kv_write_); }
