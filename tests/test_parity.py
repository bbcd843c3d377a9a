"""A delta's protection on the wire at the PS (docs/protocol.md 4a), driven without a network:
XOR parity rebuilds the one member a group lacks, a protected chunk may come three times, and a
parity or a copy that does not belong is refused and changes nothing. Last, a site's own push under chunk
loss (site/uplink.py, recovery.ChunkLoss) fed to the PS: what it rebuilds, it never waits for."""

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from wantrain.errors import ProtocolError
from wantrain.transport.messages import DeltaParity, Join
from wantrain.ps import ParameterServer
from wantrain.transport.sending import MAX_HEDGES
from wantrain.runtime.chunk_loss import ChunkLoss
from wantrain.transport.manifest import protect
from wantrain.transport.roles import roles_of
from wantrain.transport.parity import xor_parity
from wantrain.models.params import named_params
from wantrain.site.uplink import Uplink

from .helpers import small_config
from .test_delta_manifest import delta_with_manifest
from .test_server import drain, enter, rows_of

pytestmark = pytest.mark.timeout(120)


def protected(ps, round_=0, share=1.0):
    """A delta with every non-critical chunk in parity groups of 4 (`share` < 1: those holding that
    share of its importance), and each group's parity."""
    manifest, msgs, m = delta_with_manifest(ps, round_)
    manifest = protect(manifest, share=share, group_size=4) if share else manifest
    parity = {}
    for c in manifest.chunks:
        if c.group >= 0:
            parity.setdefault(c.group, []).append(msgs[c.index].data.scales + msgs[c.index].data.payload)
    return manifest, msgs, m, {g: DeltaParity(round_, g, xor_parity(p)) for g, p in parity.items()}


async def commit(lost=(), send_parity=True, extra=(), share=1.0, hedge_all=False):
    """One site's round 0 with chunks `lost` never sent, then `extra` messages before the metrics;
    the PS's round, hash and site_round event."""
    ps = ParameterServer(small_config(num_sites=1, **{"recovery.hedge_all": hedge_all, "recovery.lanes": 2}), run_dir=None)
    a = enter(ps, Join("a"))
    drain(a)
    manifest, msgs, m, parity = protected(ps, share=share)
    await ps.handle(a, manifest)
    for c in msgs:
        if c.index not in lost:
            await ps.handle(a, c)
    if send_parity:
        for p in parity.values():
            await ps.handle(a, p)
    for x in extra:
        await ps.handle(a, x)
    await ps.handle(a, m)
    await ps.round_task
    return ps.ledger.round, ps.ledger.hash, rows_of(ps, "site_round")[0]


def test_the_parity_rebuilds_any_one_lost_member_and_the_round_commits_as_if_it_came():
    ps = ParameterServer(small_config(num_sites=1), run_dir=None)
    manifest, _, _, parity = protected(ps)
    assert len(parity) >= 2
    whole = asyncio.run(commit())
    assert whole[0] == 1 and whole[2]["rebuilt"] == 0
    group = [c.index for c in manifest.chunks if c.group == 0]
    for lost in group:
        round_, hash_, site_round = asyncio.run(commit(lost={lost}))
        assert (round_, hash_) == whole[:2]                       # bit for bit what the whole delta gives
        assert site_round["rebuilt"] == 1 and site_round["protection_bytes"] == whole[2]["protection_bytes"]
    # One member lost in each of two groups: both rebuilt.
    two = {group[0], next(c.index for c in manifest.chunks if c.group == 1)}
    assert asyncio.run(commit(lost=two))[:2] == whole[:2]


def test_a_parity_that_overtakes_its_member_rebuilds_nothing_lost_and_every_byte_is_counted():
    """Over lanes a group's parity may arrive before its last member (another lane): the PS rebuilds
    that member at once, and when the member itself comes it is neither a repeat nor a loss. And the
    delta's bytes on the wire are every message of it as gRPC carries it (wire.framed_size)."""
    from wantrain.transport.wire import framed_size

    ps = ParameterServer(small_config(num_sites=1), run_dir=None)
    manifest, msgs, m, parity = protected(ps)
    last = max(c.index for c in manifest.chunks if c.group == 0)
    whole = asyncio.run(commit())
    round_, hash_, site_round = asyncio.run(commit(lost={last}, extra=[msgs[last]]))   # parity first, then it
    assert (round_, hash_) == whole[:2]
    assert site_round["rebuilt"] == 0 and site_round["protection_bytes"] == whole[2]["protection_bytes"]
    sent = [manifest, *msgs, *parity.values(), m]
    assert whole[2]["framed_bytes"] == sum(framed_size(x) for x in sent)
    assert whole[2]["parity_bytes"] == sum(len(p.payload) for p in parity.values())
    assert whole[2]["ratio"] == pytest.approx(m.raw_bytes / whole[2]["framed_bytes"])
    assert site_round["framed_bytes"] == whole[2]["framed_bytes"]     # the same messages, another order


def test_two_members_lost_from_a_group_are_not_rebuilt():
    ps = ParameterServer(small_config(num_sites=1), run_dir=None)
    manifest, _, _, _ = protected(ps)
    group = [c.index for c in manifest.chunks if c.group == 0]
    with pytest.raises(ProtocolError, match="metrics after"):      # the delta is not complete
        asyncio.run(commit(lost=set(group[:2])))


def test_a_protected_chunk_may_come_with_its_copy_and_hedges_and_no_more():
    ps = ParameterServer(small_config(num_sites=1), run_dir=None)
    manifest, msgs, _, _ = protected(ps)
    critical = msgs[min(manifest.critical())]
    whole = asyncio.run(commit())
    round_, hash_, site_round = asyncio.run(commit(extra=[critical]))
    assert (round_, hash_) == whole[:2]
    assert site_round["protection_bytes"] == whole[2]["protection_bytes"] + critical.data.wire_bytes
    hedges = [critical] * (1 + MAX_HEDGES)                   # a copy and every hedge a site sends
    assert asyncio.run(commit(extra=hedges))[:2] == whole[:2]
    with pytest.raises(ProtocolError, match=f"arrived {MAX_HEDGES + 3} times"):
        asyncio.run(commit(extra=hedges + [critical]))
    plain = msgs[next(c.index for c in manifest.chunks if c.role != "critical")]
    assert asyncio.run(commit(extra=[plain]))[:2] == whole[:2]       # in a parity group: protected
    with pytest.raises(ProtocolError, match="arrived twice"):        # in none: once only
        asyncio.run(commit(extra=[plain], share=0.0, send_parity=False))
    # recovery.hedge_all (a site with lanes): any chunk may be hedged, so come with its hedges, never
    # more; without lanes no site hedges, and a plain chunk comes once (tests/test_hostile.py)
    assert asyncio.run(commit(extra=[plain] * MAX_HEDGES, share=0.0, send_parity=False,
                              hedge_all=True))[:2] == whole[:2]
    with pytest.raises(ProtocolError, match=f"arrived {MAX_HEDGES + 2} times"):
        asyncio.run(commit(extra=[plain] * (MAX_HEDGES + 1), share=0.0, send_parity=False, hedge_all=True))


def test_a_parity_that_does_not_belong_is_refused_and_changes_nothing():
    ps = ParameterServer(small_config(num_sites=1), run_dir=None)
    manifest, _, _, parity = protected(ps)
    p0 = parity[0]
    lost = {next(c.index for c in manifest.chunks if c.group == 0)}
    garbled = replace(p0, payload=bytes(b ^ 0xFF for b in p0.payload))

    async def refused(lost, *extra, without_manifest=False):
        ps = ParameterServer(small_config(num_sites=1), run_dir=None)
        a = enter(ps, Join("a"))
        drain(a)
        m, msgs, _, _ = protected(ps)
        before = ps.ledger.hash
        if not without_manifest:
            await ps.handle(a, m)
        for c in msgs:
            if c.index not in lost:
                await ps.handle(a, c)
        with pytest.raises(ProtocolError) as info:
            for x in extra:
                await ps.handle(a, x)
        assert ps.ledger.hash == before and ps.ledger.round == 0
        return str(info.value)

    assert "without a manifest" in asyncio.run(refused(set(), p0, without_manifest=True))
    assert "does not have" in asyncio.run(refused(set(), replace(p0, group=len(parity) + 5)))
    assert "bytes; its group's longest member" in asyncio.run(refused(set(), replace(p0, payload=p0.payload[:-1])))
    assert "arrived twice" in asyncio.run(refused(set(), p0, p0))
    assert "cannot rebuild" in asyncio.run(refused(lost, garbled))   # its padding no longer zero
    flipped = replace(p0, payload=bytes([p0.payload[0] ^ 1]) + p0.payload[1:])
    assert "rebuilt a chunk that does not belong" in asyncio.run(refused(lost, flipped))   # not its CRC-32


def test_a_site_s_push_under_chunk_loss_sends_late_only_what_the_ps_cannot_rebuild():
    """The site's own transmissions (critical copies, parity over the chunks holding all the
    importance) through a lossy link: the PS rebuilds what parity covers; only the rest goes late,
    and the round commits with the model the lossless push gives."""
    cfg = small_config(num_sites=1, **{"recovery.critical_copies": True, "recovery.parity_share": 1.0,
                                       "recovery.parity_group_size": 4, "recovery.lanes": 0})   # the Session's path

    async def scenario(rate):
        ps = ParameterServer(cfg, run_dir=None)
        a = enter(ps, Join("a"))
        drain(a)
        shapes = {k: tuple(p.shape) for k, p in named_params(ps.global_model.model).items()}
        sent = []

        class Feed:
            protects = True

            async def send(self, msg):
                sent.append(msg)
                await ps.handle(a, msg)

        _, _, m = delta_with_manifest(ps, 0)
        up = Uplink("a", cfg, roles_of(shapes), loss=ChunkLoss(rate, seed=3, link="a") if rate else None,
                    late_s=0.0)
        rng = np.random.default_rng(0)
        delta = {k: (rng.standard_normal(n) * 1e-3).astype(np.float32) for k, n in ps.shapes.items()}
        figures = {k: getattr(m, k) for k in ("train_loss", "last_train_loss", "tokens", "steps", "compute_s")}
        await up.push(Feed(), 0, delta, {**figures, "decode_s": 0.0})
        await ps.round_task
        return ps.ledger.hash, rows_of(ps, "site_round")[0], sent

    whole_hash, whole_row, whole_sent = asyncio.run(scenario(0.0))
    kinds = [type(x).__name__ for x in whole_sent]
    assert kinds[0] == "Manifest" and kinds[-1] == "RoundMetrics" and "DeltaParity" in kinds
    assert whole_row["rebuilt"] == 0 and whole_row["protection_bytes"] > 0       # copies and parity, nothing lost
    hash_, row, sent = asyncio.run(scenario(0.15))
    assert hash_ == whole_hash and row["rebuilt"] >= 1
    chunks = [x.index for x in sent if type(x).__name__ == "TensorChunk"]
    assert len(set(chunks)) + row["rebuilt"] == whole_row["chunks"]              # the rebuilt ones never went
