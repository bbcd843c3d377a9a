"""Checked commits (wantrain/outer/checking.py): with two sites, a delta the update does better without
on held-out data is left out, an honest run is left alone bit for bit, and each site's record.

In-process (wantrain.studies.inprocess: the sites' inner loops, the PS's screen, check and model) for the
decision; the parameter server itself for what it journals, tells and restores.
"""

import asyncio

import numpy as np
import pytest

from wantrain.outer.checking import CheckDecision, CommitCheck
from wantrain.config import RunConfig
from wantrain.data import check_batches, eval_batches, load_run_data
from wantrain.errors import ConfigError, DataError
from wantrain.studies.inprocess import InProcessRun
from wantrain.transport.messages import Join
from wantrain.ps import ParameterServer
from wantrain.outer.screening import Verdict

from .helpers import small_config
from .test_poison import encoded_delta, push
from .test_server import drain, enter, rows_of


def tiny_run(sites: int, **changes) -> InProcessRun:
    cfg = RunConfig().replace(num_sites=sites, **{"train.rounds": 3, "train.inner_steps": 4, "model.block_size": 32,
                                                  "train.warmup_steps": 2, **changes})
    tok, corpus = load_run_data(cfg.data)
    return InProcessRun(cfg, tok, corpus)


def reversed_update(honest: dict, factor: float) -> dict:
    """What a hostile site sends: its honest delta turned around and made `factor` x longer."""
    return {k: (-factor * v).astype(np.float32) for k, v in honest.items()}


def test_check_batches_share_no_token_with_the_validation_batches():
    tokens = np.arange(50_000)
    seen = lambda batches: {int(t) for x, y in batches for t in np.concatenate([x.flatten(), y.flatten()])}
    val, check = eval_batches(tokens, 4, 32, 4), check_batches(tokens, 4, 32, 2, 4)
    assert len(check) == 2 and check[0][0].shape == (4, 32)
    assert not seen(val) & seen(check)
    with pytest.raises(DataError, match="robust.check_batches"):
        check_batches(np.arange(600), 4, 32, 2, 4)


@pytest.mark.parametrize("field, value", [("robust.check", "always"), ("robust.check_batches", 0),
                                          ("robust.check_tolerance", -0.1), ("robust.check_every", 0),
                                          ("robust.exclude_after", -1)])
def test_a_wrong_check_setting_names_its_field(field, value):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        RunConfig().replace(**{field: value})


def test_the_check_is_on_by_default_below_three_sites_only():
    assert [RunConfig().replace(num_sites=n).robust.checks(n) for n in (1, 2, 3, 5)] == [True, True, False, False]
    assert RunConfig().replace(num_sites=5, **{"robust.check": "loss"}).robust.checks(5)
    assert not RunConfig().replace(num_sites=2, **{"robust.check": "off"}).robust.checks(2)


@pytest.mark.timeout(120)
def test_two_sites_a_reversed_delta_is_left_out_and_carried():
    run = tiny_run(2)
    absent = tiny_run(2)                    # the same run, site-1 never heard from
    for r in range(2):
        start = run.start()
        d0, s0 = run.train("site-0", r, start)
        d1, _ = run.train("site-1", r, start)
        bad = run.encode(reversed_update(d1, 4.0), 10_000, run.uplinks["site-1"], None)
        verdicts = run.commit(r, {"site-0": s0, "site-1": bad})
        assert verdicts["site-0"].action == "accept"
        assert verdicts["site-1"].action == "reject" and "left out by the commit check" in verdicts["site-1"].reason
        d = run.checks[-1]
        assert d.left_out == ("site-1",) and d.without["site-1"] < d.candidate and d.final < d.candidate
        _, a0 = absent.train("site-0", r, absent.start())
        absent.commit(r, {"site-0": a0})
        assert run.model.hash() == absent.model.hash()          # as if site-1 had sent nothing
    residual = run.feedback["site-1"].residuals          # the left-out delta waits in its site's error feedback
    assert sum(float(np.abs(v).sum()) for v in residual.values()) > 0


@pytest.mark.timeout(120)
def test_an_honest_run_is_unchanged_bit_for_bit_where_nothing_is_left_out():
    hashes = {}
    for check in ("loss", "off"):
        run = tiny_run(3, **{"robust.check": check})
        for r in range(3):
            start = run.start()
            verdicts = run.commit(r, {n: run.train(n, r, start)[1] for n in run.names})
            assert all(v.action == "accept" for v in verdicts.values())
        hashes[check] = run.model.hash()
        assert len(run.checks) == (3 if check == "loss" else 0) and not any(d.left_out for d in run.checks)
    assert hashes["loss"] == hashes["off"]


def decision(round_: int, left: tuple[str, ...]) -> CheckDecision:
    return CheckDecision(round_, 3.0, 3.1, 0.01, {"a": 3.0, "b": 3.2}, left, 3.0)


def test_a_site_left_out_again_and_again_is_named_excluded_and_cleared():
    robust = RunConfig().robust.__class__(alert_after=2, exclude_after=3)
    check = CommitCheck(robust, num_sites=2)
    alerts = []
    for r in range(6):
        alerts += check.record(r, ["a", "b"], decision(r, ("a",) if r % 3 != 2 else ()))
    assert [a["action"] for a in alerts] == ["left-out", "excluded"] and all(a["site"] == "a" for a in alerts)
    assert "wantrain clear-site" in alerts[1]["message"] and check.excluded == {"a": 3}
    v = check.exclude({"a": Verdict("accept", 1.0, 1.0), "a@2": Verdict("accept", 1.0, 1.0),
                       "b": Verdict("accept", 1.0, 1.0)})
    assert [v[k].action for k in ("a", "a@2", "b")] == ["reject", "reject", "accept"]
    again = CommitCheck(robust, num_sites=2)
    again.load_state_dict(check.state_dict())
    assert again.excluded == {"a": 3} and again.clear("a") and not again.clear("a")
    assert again.exclude({"a": Verdict("accept", 1.0, 1.0)})["a"].action == "accept"


@pytest.mark.timeout(120)
def test_the_ps_leaves_out_what_makes_its_update_worse_and_keeps_it_so(tmp_path):
    """The PS's own commit: site b's delta (large noise) is left out, site a's (tiny) counted; the
    event, the result, the outcome b hears and the journal agree, and a restarted PS replays it."""
    cfg = small_config(num_sites=2, sites=["a", "b"], **{"train.rounds": 3})

    async def scenario():
        ps = ParameterServer(cfg, run_dir=tmp_path)
        a, b = enter(ps, Join("a")), enter(ps, Join("b"))
        for r in range(2):
            drain(a), drain(b)
            await push(ps, a, *encoded_delta(ps, r, 1e-5, seed=r)[:2])
            await push(ps, b, *encoded_delta(ps, r, 5e-2, seed=10 + r)[:2])
            await ps.round_task
        return ps, drain(b)
    ps, heard = asyncio.run(scenario())
    checks = rows_of(ps, "check")
    assert [c["left_out"] for c in checks] == [["b"], ["b"]]
    assert all(c["without"]["b"] < c["candidate"] and c["final"] == pytest.approx(c["without"]["b"]) for c in checks)
    assert [e["sites"] for e in rows_of(ps, "round_end")] == [["a"], ["a"]]
    assert [q["site"] for q in rows_of(ps, "quarantine")] == ["b", "b"]
    assert any(getattr(m, "outcome", "") == "rejected" and "commit check" in m.reason for m in heard)
    restarted = ParameterServer(cfg, run_dir=tmp_path)       # loads the checkpoint and replays the journal
    assert restarted.ledger.round == 2 and restarted.ledger.hash == ps.ledger.hash
    assert restarted.check.windows == ps.check.windows


@pytest.mark.timeout(120)
def test_an_operator_clears_an_excluded_site_from_the_command_line(tmp_path):
    """`wantrain clear-site` over gRPC (Report, with the observer token): the PS counts the site again."""
    from wantrain.transport.auth import Authenticator

    from .harness import InProcessCluster
    from .helpers import wantrain

    cfg = small_config(num_sites=2, sites=["a", "b"])
    (tmp_path / "observer").write_text("observer-token-0123456789")

    async def scenario():
        async with InProcessCluster(cfg, tmp_path / "run",
                                    auth=Authenticator(observer_token="observer-token-0123456789")) as c:
            c.ps.check.excluded["b"] = 1
            args = ["clear-site", "--ps", c.address, "--observer-token-file", str(tmp_path / "observer")]
            refused = await asyncio.to_thread(wantrain, *args[:3], "--site", "b")       # no token
            bad = await asyncio.to_thread(wantrain, *args, "--site", "b/../x")
            done = await asyncio.to_thread(wantrain, *args, "--site", "b")
            return refused, bad, done, dict(c.ps.check.excluded), rows_of(c.ps, "clear_site")
    refused, bad, done, excluded, events = asyncio.run(scenario())
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    assert bad.returncode == 2 and "--site" in bad.stderr
    assert done.returncode == 0 and "cleared b" in done.stdout, done.stderr
    assert excluded == {} and [e["site"] for e in events] == ["b"]


@pytest.mark.timeout(180)
def test_a_noisy_site_cannot_spoil_a_real_two_site_run(tmp_path):
    """Over gRPC: a real site trains every round; mallory, authenticated, sends round 0 a delta of
    noise well under the bound on arrival (what a broken GPU or a bad pipeline could send). The
    commit check leaves it out; mallory hears why; the honest site's replicas agree throughout."""
    from wantrain.transport.auth import Authenticator
    from wantrain.transport.messages import DeltaOutcome, RoundResult
    from wantrain.telemetry import rows

    from .cluster import check_run
    from .harness import InProcessCluster
    from .test_hostile import HandSite

    tokens = {"honest": "honest-token-0123456789", "mallory": "mallory-token-0123456789"}
    cfg = small_config(num_sites=2, sites=["honest", "mallory"], **{
        "model.preset": "tiny",          # its loss falls in 3 such rounds
        "train.rounds": 3, "train.inner_steps": 10, "schedule.quorum_wait_s": 0.5, "schedule.deadline_min_s": 30.0})

    def attack(address: str) -> list:
        m = HandSite(address, None, "mallory", tokens["mallory"])
        try:
            m.enter()
            start = m.wait_round()
            msgs, metrics = m.delta(start.round, seed=7, scale=0.25)
            for x in msgs:
                m.send(x)
            m.send(metrics)
            heard = []
            while not heard or not isinstance(heard[-1], (DeltaOutcome, RoundResult)):
                heard.append(m.recv())
            return heard
        finally:
            m.close()

    async def scenario():
        async with InProcessCluster(cfg, tmp_path / "run", auth=Authenticator(tokens)) as c:
            c.start_site("honest", token=tokens["honest"])
            heard = await asyncio.to_thread(attack, c.address)
            return heard, await c.finish()

    heard, events = asyncio.run(scenario())
    assert heard[-1].outcome == "rejected" and "commit check" in heard[-1].reason
    first = rows(events, "check")[0]
    assert first["round"] == 0 and first["left_out"] == ["mallory"]
    ends = rows(events, "round_end")
    assert all("mallory" not in e["sites"] for e in ends) and ends[-1]["val_loss"] < ends[0]["val_loss"]
    check_run([e for e in events if e.get("site") != "mallory"], 3)


def test_the_dashboard_shows_what_the_check_left_out():
    from wantrain.ui.dashboard import Dashboard

    d = Dashboard(min_interval_s=3600)
    events = [{"kind": "check", "round": 3, "base": 3.3, "candidate": 3.5, "tolerance": 0.005,
               "without": {"a": 3.6, "b": 3.2}, "left_out": ["b"], "final": 3.2, "t": 1.0, "elapsed_s": 1.0},
              {"kind": "check", "round": 4, "base": 3.2, "candidate": 3.1, "tolerance": 0.005,
               "without": {"a": 3.3, "b": 3.2}, "left_out": [], "final": 3.1, "t": 2.0, "elapsed_s": 2.0}]
    for e in events:
        d.add(e)
    d.redraw()
    assert "check</b> (round 3): left out b: check loss 3.5000 with, 3.2000 without" in d.status.value
    assert "round 4" not in d.status.value                 # a check that left nothing out is no news
