import numpy as np
import pytest

from wantrain.data import BatchSampler, ByteTokenizer, GPT2Tokenizer, load_documents, tokenize_corpus
from wantrain.errors import DataError


def test_byte_tokenizer_round_trip():
    t = ByteTokenizer()
    ids = t.encode("Wherefore art thou — Romeo?")
    assert ids.max() < 256 and t.decode(ids) == "Wherefore art thou — Romeo?"


def test_gpt2_tokenizer_offline():
    t = GPT2Tokenizer()
    ids = t.encode("Hello world")
    assert list(ids) == [15496, 995]            # GPT-2's own ids
    assert t.decode(ids) == "Hello world" and t.vocab_size == 50257


def test_shakespeare_ships_with_the_package():
    docs = load_documents("shakespeare")
    assert len(docs) > 30
    text = "".join(d.text for d in docs)
    assert "To be, or not to be" in text and "**" not in text


def test_local_files_and_folders(tmp_path):
    (tmp_path / "a.txt").write_text("first document " * 50)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("second document " * 50)
    (tmp_path / "ignored.bin").write_bytes(b"\x00\x01")        # not text
    docs = load_documents(str(tmp_path))
    assert [d.name for d in docs] == ["a.txt", "sub/b.md"]
    assert load_documents(str(tmp_path / "a.txt"))[0].text.startswith("first")


def test_missing_corpus_is_named(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_documents(str(tmp_path / "nope"))
    with pytest.raises(DataError, match="no text files"):
        load_documents(str(tmp_path))


@pytest.mark.parametrize("by", ["contiguous", "document"])
def test_shards_are_disjoint_and_hold_out_validation(tmp_path, by):
    from wantrain.data import Document
    docs = [Document(f"d{i}", f"doc{i} " * (100 + i)) for i in range(9)]
    c = tokenize_corpus(docs, ByteTokenizer(), 0.1)
    shards = [c.shard(i, 3, by) for i in range(3)]
    assert sum(s.size for s in shards) == c.val_start
    assert all(s.size > 0 for s in shards)
    if by == "contiguous":
        assert np.array_equal(np.concatenate(shards), c.tokens[: c.val_start])
    assert c.val.size == c.tokens.size - c.val_start > 0


def test_batch_sampler_resumes_exactly():
    tokens = np.arange(10_000, dtype=np.int32)
    a = BatchSampler(tokens, 4, 16, seed=1)
    for _ in range(3):
        a.next()
    state = a.state()
    x1, y1 = a.next()
    b = BatchSampler(tokens, 4, 16, seed=99)
    b.load_state(state)
    x2, y2 = b.next()
    assert (x1 == x2).all() and (y1 == y2).all() and (y1[:, :-1] == x1[:, 1:]).all()


def test_a_folder_of_code_is_a_corpus_and_the_run_says_what_it_read(tmp_path):
    """Finding 10: --corpus on a folder of .py files trained on 3 stray .txt files and said nothing."""
    from wantrain.config import DataConfig
    from wantrain.data import load_run_data

    for i in range(5):
        (tmp_path / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 40)
    (tmp_path / "notes.txt").write_text("a note " * 30)
    (tmp_path / "weights.bin").write_bytes(bytes(range(256)) * 4)          # not text: NUL bytes
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 ".encode("latin-1") * 50)  # not UTF-8
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n")                   # hidden: left out
    docs = load_documents(str(tmp_path))
    assert [d.name for d in docs] == ["mod0.py", "mod1.py", "mod2.py", "mod3.py", "mod4.py", "notes.txt"]
    assert docs.skipped == ("latin1.txt", "weights.bin")
    _, corpus = load_run_data(DataConfig(corpus=str(tmp_path)))
    s = corpus.summary()
    assert s["documents"] == 6 and s["files"][0] == "mod0.py" and s["skipped_files"] == 2
    assert s["tokens"] == sum(len(d.text.encode()) for d in docs) and s["train_tokens"] + s["val_tokens"] == s["tokens"]


def test_the_converted_plays_are_cached_and_a_bad_cache_is_ignored(tmp_path, monkeypatch):
    from wantrain.data.corpus import load_documents
    monkeypatch.setenv("WANTRAIN_CACHE", str(tmp_path))
    first = load_documents("shakespeare")
    (cache,) = tmp_path.glob("shakespeare-*.json")
    again = load_documents("shakespeare")                  # read from the cache
    assert [(d.name, d.text) for d in again] == [(d.name, d.text) for d in first]
    cache.write_text("{not json")
    assert [d.text for d in load_documents("shakespeare")] == [d.text for d in first]
    monkeypatch.setenv("WANTRAIN_CACHE", str(tmp_path / "file"))
    (tmp_path / "file").write_text("a file where the cache folder should be")
    assert [d.text for d in load_documents("shakespeare")] == [d.text for d in first]   # no cache: still works
