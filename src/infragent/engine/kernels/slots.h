// The cache slots a step writes its rows to, checked once for every kernel that writes the KV cache.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace infragent {

// slot_blocks and slot_offsets: contiguous int64 [tokens], each (block, offset) inside [num_blocks, block_size).
inline void check_slots(const at::Tensor& slot_blocks, const at::Tensor& slot_offsets, int64_t tokens,
                        int64_t num_blocks, int64_t block_size) {
  TORCH_CHECK(slot_blocks.scalar_type() == at::kLong && slot_offsets.scalar_type() == at::kLong &&
              slot_blocks.is_contiguous() && slot_offsets.is_contiguous() && slot_blocks.numel() == tokens &&
              slot_offsets.numel() == tokens, "slot_blocks and slot_offsets must be contiguous int64 [tokens]");
  const int64_t* blocks = slot_blocks.data_ptr<int64_t>();
  const int64_t* offsets = slot_offsets.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(blocks[t] >= 0 && blocks[t] < num_blocks && offsets[t] >= 0 && offsets[t] < block_size,
                "slot (", blocks[t], ", ", offsets[t], ") of token row ", t, " is outside the cache");
}

}  // namespace infragent
