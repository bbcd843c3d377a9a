"""What each tensor of a model is, by its parameter name and shape: the role that sets how much
its chunks matter when a delta loses some of them.

    critical    1-D tensors (norm gains, biases) and any tensor of at most `critical_elements`
                elements: few bytes, large effect; never left out
    embedding   token and position embeddings, the output head: their rows are data-dependent
    attention   query, key, value and output projections
    mlp         the feed-forward projections
    other       anything else

Names follow the models in wantrain.models (GPT-2: wte, h.N.attn.c_attn, h.N.mlp.c_fc; Llama:
tok_embeddings, layers.N.attn.wq, layers.N.ffn.w1) and Hugging Face's (embed_tokens, q_proj,
gate_proj, lm_head).
"""

from __future__ import annotations

import re

__all__ = ["ROLES", "role_of", "roles_of"]

ROLES = ("critical", "embedding", "attention", "mlp", "other")

_PATTERNS = (
    ("embedding", re.compile(r"(^|\.)(wte|wpe|tok_embeddings|embed_tokens|embed_positions|lm_head|output)(\.|$)")),
    ("attention", re.compile(r"(^|\.)(attn|self_attn|attention|c_attn|q_proj|k_proj|v_proj|o_proj|wq|wk|wv|wo)(\.|$)")),
    ("mlp", re.compile(r"(^|\.)(mlp|ffn|feed_forward|c_fc|gate_proj|up_proj|down_proj|w1|w2|w3)(\.|$)")),
)


def role_of(name: str, shape: tuple[int, ...], critical_elements: int = 0) -> str:
    """The role of parameter `name` of `shape` (see the module's docstring)."""
    elements = 1
    for n in shape:
        elements *= n
    if len(shape) <= 1 or elements <= critical_elements:
        return "critical"
    for role, pattern in _PATTERNS:
        if pattern.search(name):
            return role
    return "other"


def roles_of(shapes: dict[str, tuple[int, ...]], critical_elements: int = 0) -> dict[str, str]:
    """role_of for every parameter of a model (name -> shape)."""
    return {name: role_of(name, shape, critical_elements) for name, shape in shapes.items()}
