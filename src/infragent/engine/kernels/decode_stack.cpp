// DecodeStack: every layer of a decode step in one call from Python, registered as torch.classes.infragent.
//
// At one row a decode step's kernels are short (a 576-wide RMSNorm, one query's attention) and each Python
// call of an op costs more than the kernel: ~8 calls a layer, 30 layers. DecodeStack holds the plan of an
// attention-only, dense-MLP stack (each layer's norms, linears and cache) and runs the same ops, in the
// same order, on the same tensors, through the dispatcher from C++. The arithmetic is the Python path's:
// the outputs are bit for bit the same (tests/test_decode_stack.py).
//
// A linear is 5 tensor slots and 4 integers, [kind, code, n, digits]. An empty tensor stands for None.
//   kind 0, fp32:          weight_t [in, out] for at::mm; kernel W [out, in]; native_rows (bool [m_max]).
//   kind 1, stored blocks: qs, d, mins, row_scale -> infragent::qlinear(x, qs, d, mins, row_scale, code).
//   kind 2, int8 digits:   packed, pd, pm, row_scale -> infragent::qlinear_a8(..., code, n, digits).
// A layer is 4 tensors (norm_in, norm_post, k_cache, v_cache) and 4 linears (qkv, o, gate_up, down).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/mm.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <optional>
#include <vector>

namespace {

constexpr int64_t kLinearTensors = 5, kLinearInts = 4, kLayerTensors = 4 + 4 * kLinearTensors;

std::optional<at::Tensor> given(const at::Tensor& t) { return t.numel() ? std::optional<at::Tensor>(t) : std::nullopt; }

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

struct Ops {
  using Opt = const std::optional<at::Tensor>&;
  using T = const at::Tensor&;
  c10::TypedOperatorHandle<at::Tensor(T, Opt, T, double)> add_rms_norm = op<at::Tensor(T, Opt, T, double)>(
      "infragent::add_rms_norm_");
  c10::TypedOperatorHandle<at::Tensor(T)> silu_and_mul = op<at::Tensor(T)>("infragent::silu_and_mul");
  c10::TypedOperatorHandle<void(T, T, T, T, T, T, T, int64_t)> rope_and_cache =
      op<void(T, T, T, T, T, T, T, int64_t)>("infragent::rope_and_cache_");
  c10::TypedOperatorHandle<at::Tensor(T, T, T, T, T, Opt, Opt)> attention =
      op<at::Tensor(T, T, T, T, T, Opt, Opt)>("infragent::paged_decode_attention");
  c10::TypedOperatorHandle<at::Tensor(T, T, Opt, Opt, Opt, int64_t)> qlinear =
      op<at::Tensor(T, T, Opt, Opt, Opt, int64_t)>("infragent::qlinear");
  c10::TypedOperatorHandle<at::Tensor(T, T, T, T, Opt, int64_t, int64_t, int64_t)> qlinear_a8 =
      op<at::Tensor(T, T, T, T, Opt, int64_t, int64_t, int64_t)>("infragent::qlinear_a8");
  c10::TypedOperatorHandle<at::Tensor(T, T)> dense_linear = op<at::Tensor(T, T)>("infragent::dense_linear");
};

struct DecodeStack : torch::CustomClassHolder {
  std::vector<at::Tensor> tensors;
  std::vector<int64_t> ints;
  int64_t num_layers, num_heads, kv_heads, head_dim;
  double eps;
  Ops ops;

  DecodeStack(std::vector<at::Tensor> tensors, std::vector<int64_t> ints, int64_t num_heads, int64_t kv_heads,
              int64_t head_dim, double eps)
      : tensors(std::move(tensors)), ints(std::move(ints)), num_heads(num_heads), kv_heads(kv_heads),
        head_dim(head_dim), eps(eps) {
    num_layers = static_cast<int64_t>(this->tensors.size()) / kLayerTensors;
    TORCH_CHECK(num_layers * kLayerTensors == static_cast<int64_t>(this->tensors.size()) &&
                    num_layers * 4 * kLinearInts == static_cast<int64_t>(this->ints.size()),
                "DecodeStack: ", this->tensors.size(), " tensors and ", this->ints.size(),
                " integers do not make whole layers of ", kLayerTensors, " and ", 4 * kLinearInts);
  }

  at::Tensor linear(int64_t layer, int which, const at::Tensor& x) const {
    const at::Tensor* t = &tensors[layer * kLayerTensors + 4 + which * kLinearTensors];
    const int64_t* i = &ints[(layer * 4 + which) * kLinearInts];
    const at::Tensor xc = x.contiguous();
    switch (i[0]) {
      case 0: {
        const at::Tensor& native_rows = t[2];
        const int64_t rows = x.size(0);
        if (rows < native_rows.numel() && native_rows.data_ptr<bool>()[rows])
          return ops.dense_linear.call(xc, t[1].numel() ? t[1] : t[0].t());
        return at::mm(x, t[0]);
      }
      case 1:
        return ops.qlinear.call(xc, t[0], given(t[1]), given(t[2]), given(t[3]), i[1]);
      case 2:
        return ops.qlinear_a8.call(xc, t[0], t[1], t[2], given(t[3]), i[1], i[2], i[3]);
    }
    TORCH_CHECK(false, "DecodeStack: linear kind ", i[0], " (0 fp32, 1 stored blocks, 2 int8 digits)");
  }

  // hidden [T, hidden] (updated in place, and returned) after every layer; all T rows are decodes.
  at::Tensor run(at::Tensor hidden, at::Tensor cos, at::Tensor sin, at::Tensor slot_blocks, at::Tensor slot_offsets,
                 at::Tensor block_table, at::Tensor context_lens) {
    const int64_t tokens = hidden.size(0);
    std::optional<at::Tensor> delta;
    for (int64_t layer = 0; layer < num_layers; ++layer) {
      const at::Tensor* t = &tensors[layer * kLayerTensors];
      const at::Tensor x = ops.add_rms_norm.call(hidden, delta, t[0], eps);
      const at::Tensor qkv = linear(layer, 0, x);
      ops.rope_and_cache.call(qkv, cos, sin, t[2], t[3], slot_blocks, slot_offsets, num_heads);
      const at::Tensor q = qkv.view({tokens, num_heads + 2 * kv_heads, head_dim}).narrow(1, 0, num_heads);
      const at::Tensor out = ops.attention.call(q, t[2], t[3], block_table, context_lens, std::nullopt, std::nullopt);
      delta = linear(layer, 1, out.reshape({tokens, num_heads * head_dim})).contiguous();
      const at::Tensor gate_up = linear(layer, 2, ops.add_rms_norm.call(hidden, delta, t[1], eps));
      delta = linear(layer, 3, ops.silu_and_mul.call(gate_up));
    }
    if (delta.has_value()) hidden.add_(*delta);
    return hidden;
  }
};

}  // namespace

TORCH_LIBRARY_FRAGMENT(infragent, m) {
  m.class_<DecodeStack>("DecodeStack")
      .def(torch::init<std::vector<at::Tensor>, std::vector<int64_t>, int64_t, int64_t, int64_t, double>())
      .def("run", &DecodeStack::run);
}
