"""Loss recovery's parts, one function at a time: roles by name, XOR parity, the chunk-loss injector."""

from dataclasses import replace

import numpy as np

import pytest

from wantrain.errors import ConfigError, WantrainError
from wantrain.models import build_model
from wantrain.runtime.chunk_loss import ChunkLoss
from wantrain.transport.parity import rebuild, xor_parity
from wantrain.transport.roles import role_of, roles_of

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("preset", ["tiny", "llama-tiny"])
def test_every_parameter_of_the_models_has_the_role_its_name_says(preset):
    model = build_model(preset, 256, 0)
    roles = roles_of({n: tuple(p.shape) for n, p in model.named_parameters()})
    for name, role in roles.items():
        one_d = model.get_parameter(name).dim() == 1
        assert (role == "critical") == one_d, (name, role)        # norms and biases
        if not one_d:
            assert role != "other", name                          # every matrix is known
    matrices = {r for r in roles.values() if r != "critical"}
    assert matrices == {"embedding", "attention", "mlp"}


def test_roles_of_hugging_face_names_and_small_tensors():
    assert role_of("model.embed_tokens.weight", (32000, 4096)) == "embedding"
    assert role_of("lm_head.weight", (32000, 4096)) == "embedding"
    assert role_of("model.layers.3.self_attn.q_proj.weight", (4096, 4096)) == "attention"
    assert role_of("model.layers.3.mlp.down_proj.weight", (4096, 11008)) == "mlp"
    assert role_of("model.layers.3.input_layernorm.weight", (4096,)) == "critical"
    assert role_of("model.layers.0.mlp.gate.weight", (8, 4096), critical_elements=65536) == "critical"  # a router
    assert role_of("model.layers.0.mlp.gate.weight", (8, 4096)) == "mlp"
    assert role_of("pos_scale", ()) == "critical"
    assert role_of("head.proj", (10, 10)) == "other"


def test_a_parity_group_rebuilds_any_one_lost_member():
    rng = np.random.default_rng(0)
    members = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (700, 1024, 3, 0, 1023)]
    parity = xor_parity(members)
    assert len(parity) == 1024
    for lost in range(len(members)):
        present = members[:lost] + members[lost + 1:]
        assert rebuild(parity, present, len(members[lost])) == members[lost]


def test_protection_follows_the_loss_the_link_showed():
    """recovery.protection_adapts: full parity and critical copies until a push was measured, fading
    with clean pushes to none, back in proportion as soon as chunks are lost; without it, the
    settings always."""
    from wantrain.config import RecoveryConfig
    from wantrain.transport.sending import PROTECT_FULL_AT, ProtectionGauge

    gauge = ProtectionGauge(RecoveryConfig(parity_share=0.5))
    seen = []
    for _ in range(6):
        seen.append((gauge.share(), gauge.copies()))
        gauge.saw_loss(0.0)
    assert seen == [(0.5, True), (0.125, True)] + [(0.0, False)] * 4   # a clean link: its first two pushes
    gauge.saw_loss(PROTECT_FULL_AT / 2)
    assert (gauge.share(), gauge.copies()) == (0.25, True)    # half the loss that earns it all
    gauge.saw_loss(0.3)
    assert gauge.share() == 0.5                                # never more than recovery.parity_share
    assert not ProtectionGauge(RecoveryConfig(critical_copies=False)).copies()
    fixed = ProtectionGauge(RecoveryConfig(parity_share=0.5, protection_adapts=False))
    fixed.saw_loss(0.0)
    assert (fixed.share(), fixed.copies()) == (0.5, True)


def test_a_parity_that_does_not_match_is_refused_not_trusted():
    a, b = b"\x01\x02\x03\x04", b"\x05\x06"
    parity = xor_parity([a, b])
    with pytest.raises(WantrainError, match="does not match"):
        rebuild(parity, [b"\x05\x06\x07\x08"], 2)             # a member longer than the lost one changed
    with pytest.raises(WantrainError, match="cannot cover"):
        rebuild(parity, [a], 9)
    with pytest.raises(WantrainError, match="at least one"):
        xor_parity([])


@pytest.mark.parametrize("burst", [1.0, 6.0])
def test_chunk_loss_is_seeded_at_its_rate_and_bursts_as_asked(burst):
    rate, n = 0.05, 100_000
    m = ChunkLoss(rate, burst, seed=3, link="eu-west").mask(n)
    assert np.array_equal(m, ChunkLoss(rate, burst, seed=3, link="eu-west").mask(n))
    assert not np.array_equal(m, ChunkLoss(rate, burst, seed=3, link="us-east").mask(n))
    assert not np.array_equal(m, ChunkLoss(rate, burst, seed=3, link="eu-west", direction="down").mask(n))
    assert abs(m.mean() - rate) < 5 * np.sqrt(rate * burst / n) + 0.002
    edges = np.diff(np.r_[0, m.astype(np.int8), 0])
    runs = np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)          # lengths of the lost runs
    expected = burst if burst > 1 else 1 / (1 - rate)                          # i.i.d.: geometric
    assert abs(runs.mean() / expected - 1) < 0.1
    assert not ChunkLoss(0.0, burst).mask(1000).any()


def test_chunk_loss_weighs_each_transmission_by_its_size():
    # i.i.d.: a transmission u mean sizes long is lost as u of them would be, so a tiny critical
    # chunk beside large ones is almost never lost and a large one more often than the rate.
    rate, n = 0.05, 40_000
    sizes = np.tile([100, 19_900], n // 2)                 # mean 10,000 bytes: u = 0.01 and 1.99
    m = ChunkLoss(rate, seed=4, link="a").mask(sizes)
    small, large = m[0::2].mean(), m[1::2].mean()
    assert small < 0.003 and abs(large - (1 - (1 - rate) ** 1.99)) < 0.01
    assert abs(m.mean() - rate) < 0.01                     # the mean over equal bytes keeps the rate's meaning
    assert np.array_equal(ChunkLoss(rate, seed=4, link="a").mask([7, 7, 7]), ChunkLoss(rate, seed=4, link="a").mask(3))
    # Bursts run in bytes: an outage takes small and large alike, at the stationary rate.
    g = ChunkLoss(rate, 6.0, seed=4, link="a").mask(sizes)
    assert abs(g[0::2].mean() - rate) < 0.02 and abs(g[1::2].mean() - rate) < 0.02


def test_chunk_loss_names_a_bad_setting():
    with pytest.raises(ConfigError, match=r"rate must be in \[0, 1\), got 1.5"):
        ChunkLoss(1.5)
    with pytest.raises(ConfigError, match="burst must be >= 1 chunk, got 0.5"):
        ChunkLoss(0.1, 0.5)


def test_a_manifest_blind_to_energy_weighs_chunks_by_their_elements():
    from wantrain.config import Importance
    from wantrain.transport.manifest import build_manifest

    m, chunks, decoded = _manifest()
    roles = {c.tensor: c.role for c in m.chunks}
    size = build_manifest(4, chunks, decoded, roles, tokens=4096, steps=8, by=Importance.SIZE)
    total = sum(spec.length for spec, _ in chunks)
    assert [c.importance for c in size.chunks] == pytest.approx([spec.length / total for spec, _ in chunks])
    assert [c.energy for c in size.chunks] == [c.energy for c in m.chunks]       # energy still reported
    wte = [c for c in m.chunks if "wte" in c.tensor]                             # ten times the others' scale:
    assert sum(c.importance for c in wte) > 2 * sum(c.importance for c in size.chunks if "wte" in c.tensor)


def _manifest(critical_elements=0):
    from wantrain.codec import Codec, encode_arrays
    from wantrain.config import CodecConfig
    from wantrain.transport.manifest import build_manifest

    model = build_model("tiny", 256, 0)
    rng = np.random.default_rng(1)
    delta = {n: (rng.standard_normal(p.numel()) * (10.0 if "wte" in n else 1.0)).astype(np.float32)
             for n, p in model.named_parameters()}
    roles = roles_of({n: tuple(p.shape) for n, p in model.named_parameters()}, critical_elements)
    codec = Codec(CodecConfig(chunk_bytes=16384))            # 16k-element chunks: several per matrix
    chunks, decoded = encode_arrays(delta, codec, None)
    return build_manifest(4, chunks, decoded, roles, {**dict.fromkeys(set(roles.values()), 1.0), "mlp": 2.0},
                          tokens=4096, steps=8), chunks, decoded


def test_a_manifest_knows_each_chunks_energy_and_what_is_missing():
    import zlib

    m, chunks, decoded = _manifest()
    assert len(m.chunks) == len(chunks) > 20 and (m.round, m.tokens, m.steps) == (4, 4096, 8)
    total = sum(float(np.dot(v.astype(np.float64), v)) for v in decoded.values())
    assert m.total_energy == pytest.approx(total, rel=1e-9)
    assert sum(c.importance for c in m.chunks) == pytest.approx(1.0)
    mlp = [c for c in m.chunks if c.role == "mlp"]
    other = [c for c in m.chunks if c.role == "attention"]
    # role weight 2 for the MLP: per unit of energy, its chunks count twice an attention chunk's
    assert mlp[0].importance / mlp[0].energy == pytest.approx(2 * other[0].importance / other[0].energy)
    assert all(c.crc32 == zlib.crc32(enc.scales + enc.payload) and c.nbytes == enc.wire_bytes
               for c, (_, enc) in zip(m.chunks, chunks))
    assert m.missing(range(len(chunks))) == 0 and m.missing([]) == pytest.approx(1.0)
    biggest = max(m.chunks, key=lambda c: c.importance)
    assert m.missing(c.index for c in m.chunks if c is not biggest) == pytest.approx(biggest.importance)
    assert m.critical() == {c.index for c in m.chunks if c.length <= 512}   # tiny's 1-D tensors


def test_protection_covers_the_most_important_share_in_groups_on_no_critical_chunk():
    from wantrain.transport.manifest import protect

    m, _, _ = _manifest()
    p = protect(m, share=0.5, group_size=4)
    grouped = [c for c in p.chunks if c.group >= 0]
    assert sum(c.importance for c in grouped) >= 0.5
    assert not any(c.role == "critical" for c in grouped)
    # the smallest such set: without its least important member it holds less than the share
    assert sum(c.importance for c in grouped) - min(c.importance for c in grouped) < 0.5
    ungrouped = [c for c in p.chunks if c.group < 0 and c.role != "critical"]
    assert min(c.importance for c in grouped) >= max(c.importance for c in ungrouped)
    sizes = np.bincount([c.group for c in grouped])
    assert sizes.max() <= 5 and sizes.min() >= 2 and len(sizes) == -(-len(grouped) // 4) - (len(grouped) % 4 == 1)
    assert [(c.index, c.energy) for c in p.chunks] == [(c.index, c.energy) for c in m.chunks]


def _hand_manifest():
    from wantrain.transport.manifest import ChunkEntry, Manifest

    def entry(i, role, importance, group=-1, nbytes=100):
        return ChunkEntry(i, "t", 0, 10, role, importance, importance, nbytes, 0, group)
    # chunk 0: critical; 1-4: one parity group (members 1, 2, 3 ranked by importance, and 4); 5, 6: the rest
    return Manifest(0, (entry(0, "critical", 0.01), entry(1, "mlp", 0.3, 0, 120), entry(2, "mlp", 0.2, 0),
                             entry(3, "mlp", 0.25, 0), entry(4, "attention", 0.14, 0), entry(5, "mlp", 0.06),
                             entry(6, "embedding", 0.04)))


def test_the_send_order_is_critical_twice_then_groups_with_parity_then_the_rest_by_importance():
    from wantrain.transport.sending import overhead_bytes, transmissions

    order = [(t.kind, t.index) for t in transmissions(_hand_manifest())]
    assert order == [("chunk", 0), ("copy", 0), ("chunk", 1), ("chunk", 3), ("chunk", 2), ("chunk", 4), ("parity", 0),
                     ("chunk", 5), ("chunk", 6)]
    assert overhead_bytes(_hand_manifest()) == 100 + 120       # a critical copy, a parity as long as its longest
    assert [(t.kind, t.index) for t in transmissions(_hand_manifest(), copies=False)][:2] == [("chunk", 0), ("chunk", 1)]
    two = _hand_manifest()
    two = replace(two, chunks=(two.chunks[0], replace(two.chunks[1], role="critical", group=-1), *two.chunks[2:]))
    assert [(t.kind, t.index) for t in transmissions(two)][:4] == [("chunk", 0), ("chunk", 1), ("copy", 0), ("copy", 1)]


def test_what_lost_transmissions_leave_missing():
    from wantrain.transport.sending import still_missing, to_resend, transmissions

    m = _hand_manifest()
    order = transmissions(m)
    assert still_missing(m, order, []) == frozenset()
    assert still_missing(m, order, [0]) == frozenset()                 # one copy of the critical chunk
    assert still_missing(m, order, [0, 1]) == {0}                      # both
    assert still_missing(m, order, [3]) == frozenset()                 # one member of the group: rebuilt
    assert still_missing(m, order, [6]) == frozenset()                 # its parity alone
    assert still_missing(m, order, [3, 6]) == {3}                      # a member and the parity
    assert still_missing(m, order, [2, 4]) == {1, 2}                   # two members
    assert still_missing(m, order, [7, 8]) == {5, 6}                   # unprotected chunks
    assert still_missing(m, order, range(len(order))) == set(range(7))
    bare = transmissions(m, copies=False)
    assert still_missing(m, bare, [0]) == {0}                          # one copy only: lost
    assert still_missing(m, bare, [1]) == frozenset()                  # a member: rebuilt as before
    # What goes again: one of two lost members is enough while the parity is in (the PS rebuilds the other).
    assert to_resend(m, order, [2, 4]) == [1] and to_resend(m, order, [2, 4, 6]) == [1, 2]
    assert to_resend(m, order, [3, 6]) == [3] and to_resend(m, order, [8, 7]) == [5, 6]
