"""ModelShape: the architecture of a decoder model, whichever family it comes from."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """Shapes and constants shared by the llama and hybrid families."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    layer_kinds: tuple[str, ...]  # "attention" or "kda" per layer
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    kda_num_heads: int = 0
    kda_head_k_dim: int = 0
    kda_head_v_dim: int = 0
    kda_chunk_size: int = 32
    num_experts: int = 0  # 0: every feed-forward layer is a dense MLP
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    router_scoring: str = "softmax"
    first_dense_layers: int = 0
    router_skew: float = 0.0  # a routing bias rising with the expert id (0: none; the layers then have no bias)
    local_experts: tuple[int, int] | None = None  # [first, last) expert ids this rank holds; None: all

    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    @property
    def num_attention_layers(self) -> int:
        return self.layer_kinds.count("attention")

    @property
    def num_kda_layers(self) -> int:
        return self.layer_kinds.count("kda")

    def is_moe_layer(self, layer: int) -> bool:
        """Whether layer's feed-forward is a mixture of experts."""
        return self.num_experts > 0 and layer >= self.first_dense_layers

    def kernel_sizes(self) -> dict[str, int]:
        """The sizes the native kernels vectorize over (each must be a multiple of 16 for them to run)."""
        return {"head_dim": self.head_dim, "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size}
