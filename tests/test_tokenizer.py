"""Tokenizer, chat template and streaming detokenizer built from the real SmolLM2 GGUF."""
from __future__ import annotations

import os

import pytest

from infragent.engine.detokenizer import IncrementalDetokenizer
from infragent.engine.gguf_weights import default_gguf_path, read_gguf
from infragent.engine.tokenizer import Tokenizer

CORPUS = [
    "Hello, world! How are you doing today?",
    "def f(x):\n    return x**2  # square\n\n\tindent\r\n",
    "The year 2024 had 365 days; pi=3.14159, id 12345 and 1,000,000.",
    "Ünïcödé: naïve café, 日本語のテキスト, Ελληνικά, русский текст, عربى",
    "Emoji: 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 — done",
    "   leading spaces and    runs     of whitespace\n\n\n   \t\t",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more <repo_name>x<file_sep>",
    "½ ² ٣ ৩ Ⅻ numbers in other scripts; '\n 7330",
    "don't I'll we're they've it's SHOUTING'S",
    "https://example.com/path?q=1&r=2#frag {\"json\": [1, 2.5, null]}",
    " ",
    "",
]

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


@pytest.fixture(scope="module")
def gguf():
    return read_gguf()


@pytest.fixture(scope="module")
def tok(gguf) -> Tokenizer:
    return Tokenizer.from_reader(gguf)


def test_vocab_and_special_ids(tok):
    assert tok.vocab_size == 49152
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)
    assert tok.special_token_ids == frozenset(range(17))
    assert tok.add_bos_token is False
    assert tok.id_to_token(2) == "<|im_end|>"


@pytest.mark.parametrize("text, ids", [
    ("Hello, world!", [19556, 28, 905, 17]),
    ("x = 12345", [104, 446, 216, 33, 34, 35, 36, 37]),  # digits are always split one by one
    ("<|im_start|>user\nhi<|im_end|>", [1, 4093, 198, 6004, 2]),  # special tokens in text stay whole
    ("😀", [10813, 242, 218]),
    ("  two  spaces\n\n", [216, 827, 216, 5600, 1116]),
])
def test_encode_golden_ids(tok, text, ids):
    assert tok.encode(text) == ids


def test_add_bos_prepends_bos(tok):
    assert tok.encode("Hi", add_bos=True) == [1] + tok.encode("Hi")


@pytest.mark.parametrize("text", CORPUS)
def test_round_trip(tok, text):
    assert tok.decode(tok.encode(text), skip_special_tokens=False) == text


def test_decode_skips_special_tokens_by_default(tok):
    ids = tok.encode("<|im_start|>assistant\nParis.<|im_end|>")
    assert tok.decode(ids) == "assistant\nParis."
    with pytest.raises(ValueError, match="99999"):
        tok.decode([99999])


def test_chat_template_default_system_prompt(tok):
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])
    assert prompt == SYSTEM + "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_explicit_system_no_generation_prompt(tok):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}]
    assert tok.apply_chat_template(messages, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n")


@pytest.mark.parametrize("messages, match", [
    ([{"content": "hi"}], r"messages\[0\] is missing the 'role' field"),
    ([{"role": "user", "content": "a"}, {"role": "user"}], r"messages\[1\] is missing the 'content' field"),
    ([{"role": "user", "content": 3}], r"messages\[0\]\['content'\] must be a str"),
    ([], "empty"),
    ("hello", "list"),
])
def test_chat_template_rejects_bad_messages(tok, messages, match):
    with pytest.raises(ValueError, match=match):
        tok.apply_chat_template(messages)


def test_from_gguf_reader_duck_type(gguf, tok):
    class Field:
        def __init__(self, value):
            self.value = value

        def contents(self):
            return self.value

    class FakeReader:  # same interface as gguf.GGUFReader (which takes seconds to open)
        fields = {k: Field(v) for k, v in gguf.metadata.items()}

    other = Tokenizer.from_reader(FakeReader())
    assert other.encode(CORPUS[2]) == tok.encode(CORPUS[2])
    assert other.chat_template == tok.chat_template
    with pytest.raises(TypeError, match="GGUFReader"):
        Tokenizer.from_reader(object())


def test_unsupported_pre_tokenizer_is_named(gguf):
    metadata = dict(gguf.metadata, **{"tokenizer.ggml.pre": "qwen2"})
    with pytest.raises(ValueError, match="tokenizer.ggml.pre = 'qwen2'"):
        Tokenizer(metadata)


def test_detokenizer_holds_back_split_emoji(tok):
    detok = tok.detokenizer()
    deltas = [detok.add(i) for i in tok.encode("Hi 😀!")]
    assert deltas == ["Hi", "", " 😀", "!"]
    assert "\ufffd" not in "".join(deltas)


def test_detokenizer_stream_equals_decode(tok):
    text = "".join(CORPUS)
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok)
    streamed = "".join(detok.add(i) for i in ids) + detok.flush()
    assert streamed == detok.text == tok.decode(ids)


def test_detokenizer_flush_emits_incomplete_bytes(tok):
    detok = tok.detokenizer()
    assert [detok.add(i) for i in tok.encode("😀")[:2]] == ["", ""]
    assert detok.flush() == "\ufffd"
    assert detok.flush() == ""


@pytest.mark.skipif(not os.environ.get("INFRAGENT_SLOW_TESTS"), reason="set INFRAGENT_SLOW_TESTS=1 (~10 s)")
def test_matches_transformers_gguf_tokenizer(tok):
    transformers = pytest.importorskip("transformers")
    from tokenizers import pre_tokenizers

    path = default_gguf_path()
    hf = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    assert hf.encode("Hello world") == tok.encode("Hello world")  # neither adds BOS by default
    # transformers ignores tokenizer.ggml.pre='smollm' (no per-digit split); outside digits they agree.
    for text in (t for t in CORPUS if not any(c.isnumeric() for c in t)):
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False), text
    hf.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    for text in CORPUS:
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False), text
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    for gen in (True, False):
        assert tok.apply_chat_template(messages, gen) == hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=gen)


def test_slow_mode_merges_in_python_to_the_same_ids(gguf, tok):
    slow = Tokenizer.from_reader(gguf, mode="slow")
    rng = __import__("random").Random(7)
    drawn = [tok.decode([rng.randrange(tok.vocab_size) for _ in range(rng.randrange(1, 120))],
                        skip_special_tokens=False) for _ in range(60)]
    for text in CORPUS + drawn:
        assert slow.encode(text) == tok.encode(text), repr(text)
    assert slow._slow is not None and tok._slow is None  # the merges really ran in Python
