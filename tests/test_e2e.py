"""Three sites train one model: a real PS and three real sites (separate OS processes) over
loopback gRPC, and the fp32 codec's run in one process (tests/harness.py)."""

import html

import pytest

from wantrain.launch.ps_regions import costs_from_run
from wantrain.telemetry.report import write_report
from wantrain.telemetry.round_time import PARTS, round_splits, site_totals
from wantrain.launch.run import Run
from wantrain.telemetry import read_events, rows

from .harness import run_in_process
from .helpers import pid_alive, small_config

SITES = ("us-east", "eu-west", "ap-southeast")


@pytest.mark.timeout(240)
def test_three_site_processes_train_with_identical_replicas(tmp_path):
    cfg = small_config(**{"codec.mode": "int8-huffman", "train.rounds": 4})
    run = Run(cfg, run_dir=tmp_path / "run")
    with run:
        kinds = [ev["kind"] for ev in run.follow(timeout_s=200)]
        codes = run.wait_exit(60)
    pids = [p.pid for p in run.processes()]
    assert all(c == 0 for c in codes.values()), codes
    assert not any(pid_alive(p) for p in pids)
    assert kinds[-1] == "run_end"
    events = read_events(tmp_path / "run")
    check_trained(events, cfg)
    check_round_time(events, cfg)
    # The report reads on its own: the settings, a row per round, where each site's time went.
    page = html.unescape(write_report(tmp_path / "run").read_text())
    assert "4 x 8 inner steps a round" in page and "int8-huffman up, int8-huffman down" in page
    rounds_table = page.split("<h2>Rounds</h2>")[1].split("</table>")[0]
    assert rounds_table.count("<tr>") == 1 + cfg.train.rounds
    assert all(f"where {site}'s time went ({cfg.train.rounds} rounds" in page for site in SITES)
    # What `wantrain place --from-run` takes from it: each site's round, the bytes, the PS's time.
    costs = costs_from_run(tmp_path / "run")
    assert set(costs["sites"]) == set(SITES) and all(c["compute"] > 0 for c in costs["sites"].values())
    assert costs["up_bytes"] > 0 and costs["down_bytes"] > 0 and costs["lanes"]


@pytest.mark.timeout(120)
def test_the_fp32_codec_carries_a_whole_run(tmp_path):
    cfg = small_config(sites=list(SITES), **{"codec.mode": "fp32", "train.rounds": 2})
    events, cluster = run_in_process(cfg, tmp_path / "run")
    check_trained(events, cfg)
    assert {s.hash for s in cluster.sites.values()} == {cluster.ps.ledger.hash}


@pytest.mark.timeout(120)
def test_each_site_sends_in_its_own_encoding_and_every_replica_stays_identical(tmp_path):
    """A site's codec is its own setting (`wantrain worker --codec`): one site sends top-k deltas
    (1/64 of each block), one ternary, one the run's INT8 + Huffman; the PS's updates go in 4 bits
    (codec.update_mode). Every site's replica is the PS's after every round."""
    import asyncio

    from .harness import InProcessCluster

    cfg = small_config(sites=list(SITES), **{"codec.update_mode": "int4-huffman", "train.rounds": 3})
    codecs = {"us-east": "topk", "eu-west": "ternary-huffman", "ap-southeast": ""}

    async def go() -> tuple[list[dict], InProcessCluster]:
        async with InProcessCluster(cfg, tmp_path / "run") as c:
            for site, codec in codecs.items():
                c.start_site(site, codec=codec)
            return await c.finish(120), c
    events, cluster = asyncio.run(go())
    ends, checks = rows(events, "round_end"), rows(events, "hash_check")
    assert len(ends) == 3 and not rows(events, "error") and not rows(events, "quarantine")
    assert len(checks) == 9 and all(c["ok"] for c in checks)
    assert {s.hash for s in cluster.sites.values()} == {cluster.ps.ledger.hash}
    assert ends[-1]["val_loss"] < rows(events, "run_start")[0]["val_loss"]
    for s in rows(events, "site_round"):
        assert s["encoding"] == (codecs[s["site"]] or "int8-huffman") and s["received_wire_bytes"] == s["wire_bytes"]
        # the codec's own ratio (the encoded chunks), and the headline's, every byte of the delta counted
        assert s["raw_bytes"] / s["wire_bytes"] > {"topk": 100, "ternary-huffman": 15, "int8-huffman": 3.9}[s["encoding"]], s
        assert s["framed_bytes"] > s["wire_bytes"] and s["ratio"] == s["raw_bytes"] / s["framed_bytes"], s


def check_round_time(events: list[dict], cfg) -> None:
    """Where each round went (wantrain/telemetry/round_time.py), from real processes' timers: every site's
    every round is split, each measured part is a duration, and what the timers left unexplained
    is a small share of the wall time. (About 2-4 % here, where three sites share two cores in
    rounds of a second; the first round's includes opening the lanes. The bound has room for a
    busy machine: it catches a part that stops being measured, not a slow one.)"""
    splits = round_splits(events)
    assert sorted((s["site"], s["round"]) for s in splits) == sorted(
        (site, r) for site in SITES for r in range(cfg.train.rounds))
    for s in splits:
        assert s["compute_s"] > 0 and s["upload_s"] >= 0, s
        assert all(s[f"{p}_s"] >= -0.01 for p in PARTS if p != "other"), s
        assert sum(s[f"{p}_s"] for p in PARTS) == pytest.approx(s["wall_s"])
    for site, d in site_totals(splits).items():
        print(f"{site}: " + ", ".join(f"{p} {d[f'{p}_s'] / d['wall_s']:.1%}" for p in PARTS))
        assert abs(d["other_s"]) < 0.12 * d["wall_s"], (site, d)


def check_trained(events: list[dict], cfg) -> None:
    mode = cfg.codec.mode
    start, ends = rows(events, "run_start")[0], rows(events, "round_end")
    assert len(ends) == cfg.train.rounds
    assert len(rows(events, "join")) == 3 and not rows(events, "error")

    # The loss falls: the global model's validation loss, and each site's training loss.
    vals = [start["val_loss"]] + [e["val_loss"] for e in ends]
    assert vals[-1] < vals[0] - 0.5, vals
    for site in SITES:
        mine = [e for e in rows(events, "site_round") if e["site"] == site]
        assert len(mine) == cfg.train.rounds
        if len(mine) > 2:
            assert mine[-1]["train_loss"] < mine[0]["train_loss"]

    # Every round, all four parties hold the same parameters: each site's own hash (computed
    # from its replica after applying the update) equals the PS's.
    checks = rows(events, "hash_check")
    assert len(checks) == 3 * cfg.train.rounds
    for e in ends:
        mine = [c for c in checks if c["round"] == e["round"]]
        assert {c["site"] for c in mine} == set(SITES)
        assert all(c["ok"] and c["site_hash"] == e["model_hash"] for c in mine)
    assert len({e["model_hash"] for e in ends}) == len(ends)        # and the model really moves

    # The bytes the PS received per round are the bytes the sites' codec produced.
    for s in rows(events, "site_round"):
        assert s["received_wire_bytes"] == s["wire_bytes"] > 0
        expected_raw = 4 * start["num_params"]
        assert s["raw_bytes"] == expected_raw
        if mode == "fp32":
            assert s["wire_bytes"] == expected_raw
        else:
            assert 3.9 < s["raw_bytes"] / s["wire_bytes"] < 5.5 and 5.0 < s["huffman_bits_per_symbol"] < 8.0
            assert 3.3 < s["ratio"] < s["raw_bytes"] / s["wire_bytes"]      # every byte: protection and headers too
    for e in ends:
        assert (e["ratio"] > 3.9) if mode != "fp32" else (e["wire_bytes"] == 4 * start["num_params"])


@pytest.mark.timeout(180)
def test_a_site_that_dies_fails_the_run_and_nothing_is_left(tmp_path):
    import os
    import signal

    from wantrain.errors import ProcessError

    run = Run(small_config(**{"train.rounds": 50}), run_dir=tmp_path / "run")
    with pytest.raises(ProcessError, match="site eu-west exited with code -9"):
        with run:
            for ev in run.follow(timeout_s=150):
                if ev["kind"] == "round_end":
                    os.kill(run.workers["eu-west"].pid, signal.SIGKILL)
    assert not any(pid_alive(p.pid) for p in run.processes())
