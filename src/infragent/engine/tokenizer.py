"""Byte-level BPE tokenizer and chat template rebuilt from GGUF metadata (SmolLM2)."""

from __future__ import annotations

import json

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as _HFTokenizer

from infragent.engine.detokenizer import IncrementalDetokenizer
from infragent.engine.gguf_weights import GGUFFile, read_gguf
from infragent.engine.tokenizer_slow import SlowBPE

__all__ = ["IncrementalDetokenizer", "Tokenizer"]

_TOKEN_TYPE_CONTROL = 3  # llama.cpp token types: 1 normal, 3 control, 4 user-defined
_TOKEN_TYPE_USER_DEFINED = 4
_KEYS = ("model", "pre", "tokens", "merges", "token_type", "bos_token_id", "eos_token_id", "add_bos_token")


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character each byte is written as in the vocabulary."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_UNICODE_TO_BYTE = _byte_alphabet()


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """Pre-tokenizer for a `tokenizer.ggml.pre` value."""
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre == "smollm":
        # llama.cpp 'smollm': split every \p{N} digit, then the GPT-2 regex (same as SmolLM2's tokenizer.json).
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("gpt-2", "default"):
        return byte_level
    raise ValueError(f"tokenizer.ggml.pre = {pre!r} is not supported (supported: 'smollm', 'gpt-2', 'default')")


class Tokenizer:
    """Encode/decode text and render chat prompts for a GGUF byte-level BPE model."""

    def __init__(self, metadata: Mapping[str, Any], source: str = "<metadata>", mode: str = "fast") -> None:
        def get(key: str, default: Any = ...) -> Any:
            full = f"tokenizer.ggml.{key}"
            if full not in metadata and default is ...:
                raise ValueError(f"{source}: GGUF metadata key {full!r} is missing; cannot build the tokenizer")
            return metadata.get(full, default)

        if get("model") != "gpt2":
            raise ValueError(f"{source}: tokenizer.ggml.model is {get('model')!r}; only byte-level BPE ('gpt2') is supported")
        tokens: list[str] = list(get("tokens"))
        token_types: list[int] = list(get("token_type", [1] * len(tokens)))
        merges = [tuple(m.split(" ")) for m in get("merges")]
        if any(len(m) != 2 for m in merges):
            raise ValueError(f"{source}: tokenizer.ggml.merges has entries that are not 'left right' pairs")
        bpe_vocab = {t: i for i, t in enumerate(tokens)}
        bpe = models.BPE(vocab=bpe_vocab, merges=merges, fuse_unk=False, byte_fallback=False)
        tok = _HFTokenizer(bpe)
        tok.pre_tokenizer = _pre_tokenizer(get("pre", "default"))
        tok.decoder = decoders.ByteLevel()
        specials = [t for t, k in zip(tokens, token_types) if k == _TOKEN_TYPE_CONTROL]
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
        user = [t for t, k in zip(tokens, token_types) if k == _TOKEN_TYPE_USER_DEFINED]
        tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
        if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
            raise ValueError(f"{source}: tokenizer vocabulary has duplicate tokens; the GGUF file looks corrupt")

        self._tok = tok
        self._slow = None if mode == "fast" else SlowBPE(
            bpe_vocab, merges, specials + user, lambda text: [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(text)])
        self._source = source
        self._tokens = tokens
        self._special_ids = frozenset(i for i, k in enumerate(token_types) if k == _TOKEN_TYPE_CONTROL)
        self._bos: int | None = get("bos_token_id", None)
        self._eos: int | None = get("eos_token_id", None)
        self.add_bos_token: bool = bool(get("add_bos_token", False))
        self.chat_template: str | None = metadata.get("tokenizer.chat_template")
        self._compiled_template: Any = None
        self._max_token_chars: int | None = None

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, path: str | Path | None = None, mode: str = "fast") -> Tokenizer:
        """Build from a GGUF file (None -> the default SmolLM2 GGUF); mode slow: the merges in Python."""
        return cls.from_reader(read_gguf(path), mode)

    @classmethod
    def from_reader(cls, reader: Any, mode: str = "fast") -> Tokenizer:
        """Build from an already-parsed GGUF: an infragent GGUFFile or a `gguf.GGUFReader`."""
        if isinstance(reader, GGUFFile):
            return cls(reader.metadata, source=str(reader.path), mode=mode)
        fields = getattr(reader, "fields", None)
        if fields is None:
            raise TypeError(f"expected a GGUFFile or gguf.GGUFReader, got {type(reader).__name__}")
        wanted = [f"tokenizer.ggml.{k}" for k in _KEYS] + ["tokenizer.chat_template"]
        metadata = {k: fields[k].contents() for k in wanted if k in fields}
        return cls(metadata, source=str(getattr(reader, "path", "<GGUFReader>")), mode=mode)

    # ---- properties ---------------------------------------------------------------------
    @property
    def bos_token_id(self) -> int | None:
        """Id of the BOS token (`<|im_start|>` for SmolLM2), or None if the file defines none."""
        return self._bos

    @property
    def eos_token_id(self) -> int | None:
        """Id of the EOS token (`<|im_end|>` for SmolLM2-Instruct), or None if the file defines none."""
        return self._eos

    @property
    def vocab_size(self) -> int:
        """Number of token ids (including special tokens)."""
        return len(self._tokens)

    @property
    def special_token_ids(self) -> frozenset[int]:
        """Ids of control tokens (e.g. `<|im_start|>`, `<|im_end|>`, `<|endoftext|>`)."""
        return self._special_ids

    def id_to_token(self, token_id: int) -> str:
        """Raw vocabulary string of a token id (byte-level alphabet, e.g. 'Ġthe')."""
        return self._tokens[token_id]

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for (special tokens: their text), possibly a partial UTF-8 character."""
        if token_id in self._special_ids:
            return self._tokens[token_id].encode("utf-8")
        return bytes(_UNICODE_TO_BYTE.get(ch, 0x3F) for ch in self._tokens[token_id])

    @property
    def max_token_chars(self) -> int:
        """The most characters one token covers: a text longer than n times this cannot be under n tokens."""
        if self._max_token_chars is None:
            self._max_token_chars = max(len(self.token_bytes(i)) for i in range(len(self._tokens)))
        return self._max_token_chars

    def save_hf(self, directory: str | Path) -> Path:
        """Write this tokenizer as a Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json),
        for outside tools that load one by path (transformers' AutoTokenizer, guidellm's --processor)."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(folder / "tokenizer.json"))
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30,
                  "add_bos_token": self.add_bos_token}
        for name, token_id in (("bos_token", self._bos), ("eos_token", self._eos)):
            if token_id is not None:
                config[name] = self._tokens[token_id]
        if self.chat_template:
            config["chat_template"] = self.chat_template
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
        return folder

    # ---- encode / decode ----------------------------------------------------------------
    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids for text; special-token strings like `<|im_start|>` in text map to their ids."""
        if not isinstance(text, str):
            raise TypeError(f"encode() needs a str, got {type(text).__name__}")
        if self._slow is not None:
            ids = self._slow.encode(text)
        else:
            # encode_batch releases the GIL while it works (encode holds it): a long prompt tokenized in a worker
            # thread then does not stall the server's event loop
            ids = self._tok.encode_batch([text], add_special_tokens=False)[0].ids
        if add_bos:
            if self._bos is None:
                raise ValueError(f"{self._source}: add_bos=True but the GGUF defines no tokenizer.ggml.bos_token_id")
            ids.insert(0, self._bos)
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text for token ids (invalid/partial UTF-8 becomes U+FFFD)."""
        ids = list(ids)
        bad = [i for i in ids if not 0 <= i < len(self._tokens)]
        if bad:
            raise ValueError(f"decode(): token id {bad[0]} is outside the vocabulary [0, {len(self._tokens)})")
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def detokenizer(self, skip_special_tokens: bool = True) -> IncrementalDetokenizer:
        """A fresh streaming detokenizer bound to this tokenizer."""
        return IncrementalDetokenizer(self, skip_special_tokens=skip_special_tokens)

    # ---- chat ---------------------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """Render messages ([{'role': ..., 'content': ...}]) with the GGUF's Jinja chat template."""
        _validate_messages(messages)
        try:
            return self._template().render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self._token_or_empty(self._bos),
                eos_token=self._token_or_empty(self._eos),
            )
        except TemplateError as exc:
            raise ValueError(f"{self._source}: chat template failed to render: {exc}") from exc

    def _token_or_empty(self, token_id: int | None) -> str:
        return self._tokens[token_id] if token_id is not None else ""

    def _template(self) -> Any:
        if self._compiled_template is None:
            if not self.chat_template:
                raise ValueError(f"{self._source}: GGUF has no tokenizer.chat_template; format the prompt yourself")
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = _raise_template_error
            self._compiled_template = env.from_string(self.chat_template)
        return self._compiled_template


def _raise_template_error(message: str) -> None:
    raise TemplateError(message)


def _validate_messages(messages: Sequence[Mapping[str, str]]) -> None:
    """Raise ValueError naming the offending message/field."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError("messages must be a list of {'role': str, 'content': str} dicts")
    if not messages:
        raise ValueError("messages is empty; pass at least one {'role': ..., 'content': ...} message")
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(msg).__name__}")
        for field in ("role", "content"):
            if field not in msg:
                raise ValueError(f"messages[{i}] is missing the {field!r} field")
            if not isinstance(msg[field], str):
                raise ValueError(f"messages[{i}][{field!r}] must be a str, got {type(msg[field]).__name__}")
