"""The named model presets a run picks from: family and architecture, without importing torch.

`RunConfig` checks a preset name against this table; wantrain.models builds the model.
vocab_size None: taken from the run's tokenizer.
"""

from __future__ import annotations

__all__ = ["PRESETS"]

PRESETS: dict[str, tuple[str, dict]] = {
    # For tests and smoke checks of a deployment: a quarter of tiny's step time (10 ms against 42
    # for 4 sequences of 64 bytes on one core), with every tensor kind a GPT has.
    "micro": ("gpt", dict(n_layer=2, n_head=2, n_embd=64, block_size=256, vocab_size=None)),
    "tiny": ("gpt", dict(n_layer=4, n_head=4, n_embd=128, block_size=256, vocab_size=None)),
    "small": ("gpt", dict(n_layer=6, n_head=6, n_embd=384, block_size=512, vocab_size=None)),
    "llama-tiny": ("llama", dict(n_layer=4, n_head=4, n_kv_head=2, n_embd=128, ffn_hidden=352,
                                 block_size=256, vocab_size=None)),
    "gpt2": ("gpt", dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257)),
    "gpt2-medium": ("gpt", dict(n_layer=24, n_head=16, n_embd=1024, block_size=1024, vocab_size=50257)),
    "llama3-1b": ("llama", dict(n_layer=16, n_head=32, n_kv_head=8, n_embd=2048, ffn_hidden=8192,
                                block_size=2048, vocab_size=128256)),
}
