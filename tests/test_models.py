import pytest
import torch

from wantrain.errors import ConfigError
from wantrain.models import build_model, count_parameters


@pytest.mark.parametrize("preset, expected", [
    ("gpt2", 124_439_808),
    ("gpt2-medium", 354_823_168),
    ("llama3-1b", 1_235_814_400),
])
def test_large_presets_have_exact_parameter_counts(preset, expected):
    model = build_model(preset, vocab_size=0, device="meta")
    assert count_parameters(model) == expected


@pytest.mark.parametrize("preset", ["micro", "tiny", "llama-tiny"])
def test_small_presets_train_and_are_deterministic(preset):
    a, b = build_model(preset, 256, seed=3), build_model(preset, 256, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    c = build_model(preset, 256, seed=4)
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))
    x = torch.randint(0, 256, (2, 32))
    logits = a(x)                                           # (B, T, vocab)
    assert logits.shape == (2, 32, 256)
    # Causal: the first position's output does not depend on later tokens.
    x2 = x.clone()
    x2[:, 5:] = (x2[:, 5:] + 1) % 256
    assert torch.allclose(a(x2)[:, :5], logits[:, :5], atol=1e-5)
    opt = torch.optim.AdamW(a.parameters(), lr=1e-2)
    losses = []
    for _ in range(20):
        loss = torch.nn.functional.cross_entropy(a(x).flatten(0, 1), x.roll(-1, 1).flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] * 0.7


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown model preset 'gpt9'"):
        build_model("gpt9", 256)


def test_the_inner_adamw_is_torchs_adamw_bit_for_bit_without_importing_dynamo():
    """Sites step with torch's functional AdamW (site/adamw.py): the same bits as torch.optim.AdamW,
    without the Optimizer class, whose first use imports torch._dynamo (about 70 MB a process)."""
    import subprocess
    import sys

    code = '''
import sys, torch
from wantrain.site.adamw import InnerAdamW
torch.manual_seed(0)
a = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
b = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))
b.load_state_dict(a.state_dict())
ours = InnerAdamW(a.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
dynamo = "torch._dynamo" in sys.modules
theirs = torch.optim.AdamW(b.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
for i in range(5):
    x = torch.randn(8, 16)
    for m, opt in ((a, ours), (b, theirs)):
        opt.zero_grad()
        m(x).pow(2).mean().backward()
        lr = 1e-2 * (i + 1) / 5
        if opt is ours:
            opt.lr = lr
        else:
            opt.param_groups[0]["lr"] = lr
        opt.step()
print(dynamo, all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters())))
'''
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["False", "True"], (r.stdout, r.stderr)
