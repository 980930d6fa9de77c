// Fused elementwise kernels of a decoder layer (fp32, CPU), registered as torch.ops.infragent.*.
//
// add_rms_norm_: hidden += delta in place (the residual add), then RMSNorm(hidden) * weight into a new
//   tensor: one pass over each row instead of torch's add, pow, mean, rsqrt and two multiplies.
// silu_and_mul: silu(gate) * up for the fused gate_up rows [tokens, 2 * inter] -> [tokens, inter].
// Rows split over torch's thread pool once there are enough of them to pay for waking it.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>

#include "vec.h"

namespace {

using namespace infragent;

constexpr int64_t kParallelGrain = 1 << 14;  // floats of work per thread before splitting rows

int64_t grain_rows(int64_t row_length) { return std::max<int64_t>(1, kParallelGrain / row_length); }

at::Tensor add_rms_norm_(const at::Tensor& hidden, const std::optional<at::Tensor>& delta, const at::Tensor& weight,
                         double eps) {
  TORCH_CHECK(hidden.dim() == 2 && hidden.scalar_type() == at::kFloat && hidden.is_contiguous(),
              "hidden must be a contiguous fp32 [tokens, hidden_size] tensor");
  const int64_t tokens = hidden.size(0), width = hidden.size(1);
  TORCH_CHECK(width % 16 == 0, "hidden_size ", width, " must be a multiple of 16");
  TORCH_CHECK(weight.scalar_type() == at::kFloat && weight.is_contiguous() && weight.numel() == width,
              "weight must be contiguous fp32 [hidden_size]");
  const float* add = nullptr;
  if (delta.has_value()) {
    TORCH_CHECK(delta->scalar_type() == at::kFloat && delta->is_contiguous() && delta->sizes() == hidden.sizes(),
                "delta must be contiguous fp32 shaped like hidden");
    add = delta->data_ptr<float>();
  }
  auto out = at::empty(hidden.sizes(), hidden.options());
  float* h = hidden.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  at::parallel_for(0, tokens, grain_rows(width), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* row = h + t * width;
      vec16 squares = vec16{};
      for (int64_t i = 0; i < width; i += 16) {
        vec16 x = load16(row + i);
        if (add != nullptr) {
          x += load16(add + t * width + i);
          store16(row + i, x);
        }
        squares += x * x;
      }
      const float scale = 1.f / std::sqrt(hsum(squares) / static_cast<float>(width) + static_cast<float>(eps));
      for (int64_t i = 0; i < width; i += 16) store16(o + t * width + i, load16(row + i) * scale * load16(w + i));
    }
  });
  return out;
}

at::Tensor silu_and_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.scalar_type() == at::kFloat && gate_up.is_contiguous() &&
              gate_up.size(1) % 32 == 0, "gate_up must be contiguous fp32 [tokens, 2 * inter], inter a multiple of 16");
  const int64_t tokens = gate_up.size(0), inter = gate_up.size(1) / 2;
  auto out = at::empty({tokens, inter}, gate_up.options());
  const float* in = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, tokens, grain_rows(inter), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* gate = in + t * 2 * inter;
      for (int64_t i = 0; i < inter; i += 16) {
        const vec16 x = load16(gate + i);
        const vec16 e = exp_nonpositive(x < 0.f ? x : -x);  // e^-|x|: sigmoid without overflow
        const vec16 sigmoid = x < 0.f ? e / (1.f + e) : 1.f / (1.f + e);
        store16(o + t * inter + i, x * sigmoid * load16(gate + inter + i));
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(infragent, m) {
  m.def("add_rms_norm_(Tensor(a!) hidden, Tensor? delta, Tensor weight, float eps) -> Tensor");
  m.def("silu_and_mul(Tensor gate_up) -> Tensor");
}

TORCH_LIBRARY_IMPL(infragent, CPU, m) {
  m.impl("add_rms_norm_", add_rms_norm_);
  m.impl("silu_and_mul", silu_and_mul);
}
