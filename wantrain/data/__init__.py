"""Tokenizers, corpora and per-site shards, all offline."""

from .batches import BatchSampler, check_batches, eval_batches
from .corpus import Document, TokenizedCorpus, load_documents, tokenize_corpus
from .tokenizers import ByteTokenizer, GPT2Tokenizer, Tokenizer, get_tokenizer

__all__ = ["BatchSampler", "check_batches", "eval_batches", "Document", "TokenizedCorpus", "load_documents", "tokenize_corpus",
           "ByteTokenizer", "GPT2Tokenizer", "Tokenizer", "get_tokenizer", "load_run_data"]


def load_run_data(data_cfg) -> tuple[Tokenizer, TokenizedCorpus]:
    """Tokenizer and tokenized corpus for a DataConfig (used by the PS and every site)."""
    tok = get_tokenizer(data_cfg.tokenizer)
    return tok, tokenize_corpus(load_documents(data_cfg.corpus), tok, data_cfg.val_fraction)
