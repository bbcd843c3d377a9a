"""A killed parameter server loses no round, whichever door the run came through (issue 27: one
check in place of six near-copies). Each door is driven to the same fault, a SIGKILL of the PS (or
of one shard of it) in the middle of a run, and the run it leaves is checked the same way: every
round committed exactly once, every replica equal to the PS's model, one restart that resumed
where the last committed round left off, and the run's clock kept across it.

- `cluster-aggregate`, `cluster-checkpoint`: the PS and sites as processes started by hand, the
  kill held at a precise point by `--stall` (killed aggregating: the round never committed; killed
  writing the full checkpoint: the round committed in the journal and is replayed).
- `run`: through `Run`, as the notebook's buttons call it (a site killed and started too).
- `remote`: `Run` with the PS on an SSH host (a cloud VM), followed through a forward.
- `shard`: one shard of a sharded PS, killed aggregating a round the other shard committed; every
  shard still counts the same sites' deltas (the sites replay to the restarted shard what it lost).
"""

import sys

import pytest

from wantrain.launch.run import Run
from wantrain.telemetry import read_events, rows

from .cluster import Cluster, ShardedCluster, check_run
from .helpers import pid_alive, small_config


def check_recovered(events: list[dict], rounds: int, resumed_at: set[int]) -> None:
    check_run(events, rounds)                   # each round once, replicas equal, one clock
    (restart,) = rows(events, "restart")
    assert restart["round"] in resumed_at, (restart["round"], resumed_at)
    assert next(e for e in rows(events, "round_end") if e["t"] > restart["t"])["round"] == restart["round"]


def after_round_1(rounds: int) -> set[int]:
    """Where a PS stopped once the test saw round 1 commit may resume: the rounds it commits before
    it stops depend on how busy the machine is (it resumed at 4 twice), so any round after 1 and
    before the last. That it resumed where it left off is check_recovered's to check."""
    return set(range(2, rounds))


def cluster_door(tmp_path, phase: str) -> tuple[list[dict], int, set[int]]:
    rounds = 5
    cfg = small_config(**{"sites": ["a", "b", "c"], "train.rounds": rounds, "train.inner_steps": 10,
                          "schedule.quorum_wait_s": 1.0, "schedule.deadline_min_s": 15.0, "schedule.deadline_initial_s": 60.0})
    c = Cluster(tmp_path, cfg)
    try:
        c.start_ps("--stall", f"{phase}=60").wait_for("listening on")
        for name in cfg.sites:
            c.start_site(name)
        c.wait_event("stall")
        c.kill(c.ps)
        assert (c.run_dir / "checkpoint.pt.tmp").exists() == phase.startswith("checkpoint")
        c.start_ps()
        events = c.finish()
    finally:
        c.close()
    # Killed aggregating round 2: it never committed. Killed writing the checkpoint after round 2:
    # round 2 had committed (in the journal) and is replayed.
    return events, rounds, {2 if phase.startswith("aggregate") else 3}


def run_door(tmp_path) -> tuple[list[dict], int, set[int]]:
    # Rounds are 2 s compute budgets, so the killed site (a new process: seconds on a busy machine)
    # is back before the run ends however fast the machine is; the PS restarts once it is.
    rounds = 8
    cfg = small_config(num_sites=2, **{"train.rounds": rounds, "train.round_budget_s": 2.0, "schedule.quorum_wait_s": 1.0})
    restarted_after = None
    with Run(cfg, run_dir=tmp_path / "run") as run:
        victim = run.sites[0]
        old_site, old_ps = run.workers[victim], run.ps
        killed = back = False
        for ev in run.follow(timeout_s=240):         # follow() goes on through both faults
            if ev["kind"] == "round_end" and ev["round"] == 1 and not killed:
                run.kill_site(victim)
                run.start_site(victim)
                killed = True
            back = back or (killed and ev["kind"] == "join" and ev["site"] == victim)
            if ev["kind"] == "round_end" and ev["round"] >= 3 and back and restarted_after is None:
                run.restart_ps()
                restarted_after = ev["round"]
        codes = run.wait_exit(60)
    assert not pid_alive(old_site.pid) and not pid_alive(old_ps.pid)
    assert all(c == 0 for c in codes.values()), codes
    assert restarted_after is not None and restarted_after <= 6, "the killed site was not back in time"
    assert [e["round"] for e in rows(run.events, "restart")]        # follow() saw the PS come back
    events = read_events(run.run_dir)                                # all of them, after run_end too
    rejoins = [e for e in rows(events, "join") if e["site"] == victim and e["resumed"]]
    assert len(rejoins) >= 2                                         # after its kill, after the PS restart
    return events, rounds, {restarted_after + 1, restarted_after + 2}


def move_door(tmp_path) -> tuple[list[dict], int, set[int]]:
    """The PS moved to another region mid-run (Run.move_ps): stopped, started again from its
    checkpoint, the sites' links now with that region's RTTs; the sites come back by themselves."""
    rounds = 6
    cfg = small_config(**{"train.rounds": rounds, "train.inner_steps": 10, "schedule.quorum_wait_s": 60.0})
    with Run(cfg, run_dir=tmp_path / "run", scenario="loopback") as run:   # every site and the PS in East US
        moved = False
        for ev in run.follow(timeout_s=300):
            if ev["kind"] == "round_end" and ev["round"] == 1 and not moved:
                run.move_ps("West Europe")
                moved = True
        codes = run.wait_exit(60)
        plan = run.run_plan
    assert all(c == 0 for name, c in codes.items() if name != "link emulator"), codes   # (it runs until stopped)
    events = read_events(run.run_dir)
    (fault,) = [e for e in rows(events, "fault") if e["action"] == "move PS"]
    (there,) = rows(events, "ps_moved")
    assert there["ps_region"] == fault["region"] == plan.ps_region == "West Europe"
    assert there["rtt_ms"] == fault["rtt_ms"] == {s.name: s.rtt_ms for s in plan.sites}
    assert all(rtt > 50 for rtt in there["rtt_ms"].values())           # East US -> West Europe
    links = rows(events, "link")                                        # what the links did, before and after
    assert max(e["trace_rtt_ms"] for e in links if e["t"] < there["t"]) < 1.0
    after = [e for e in links if e["t"] > there["t"] + 1.0]
    assert after and all(e["trace_rtt_ms"] >= 0.95 * there["rtt_ms"][e["site"]] for e in after)
    return events, rounds, after_round_1(rounds)


def remote_door(tmp_path, venvs: str) -> tuple[list[dict], int, set[int]]:
    from wantrain.launch import RemotePS, RemoteSite

    from .sshd import SshServer

    cloud, edge = SshServer(tmp_path / "cloud"), SshServer(tmp_path / "edge")
    common = dict(python=sys.executable, reuse_site_packages=True, venvs=venvs)
    ps = RemotePS(cloud.url, public_host="127.0.0.1", bind="127.0.0.1", run_root=str(tmp_path / "cloud-runs"),
                  key_file=cloud.key_file, known_hosts=str(cloud.known_hosts), **common)
    site = RemoteSite(edge.url, key_file=edge.key_file, known_hosts=str(edge.known_hosts), **common)
    rounds = 6
    cfg = small_config(**{"sites": ["a", "b"], "num_sites": 2, "train.rounds": rounds, "train.inner_steps": 12,
                          "schedule.quorum_wait_s": 120.0})
    try:
        with Run(cfg, run_dir=tmp_path / "run", ps_on=ps, remote={"b": site}) as run:
            assert run.address != run.site_address and run.address.startswith("127.0.0.1:")   # a forward
            modes = [m.split() for m in ps.launcher.run(f"stat -c '%a %n' {ps.folder} {ps.folder}/*")[1].splitlines()]
            assert modes[0][0] == "700" and all(mode == "600" for mode, path in modes[1:]
                                                if not path.endswith("ps.port")), modes   # tokens, key, config
            assert any(path.endswith("tokens-tokens.json") for _, path in modes)   # a token per site
            restarted = False
            for ev in run.follow(timeout_s=400):
                if ev["kind"] == "round_end" and ev["round"] == 1 and not restarted:
                    run.restart_ps()                       # on its host, from its checkpoint, same port
                    restarted = True
            codes = run.wait_exit(60)
    finally:
        cloud.close()
        edge.close()
    assert all(code == 0 for name, code in codes.items() if "site" in name), codes
    assert (tmp_path / "cloud-runs" / "run" / "events.jsonl").exists()      # the PS's own, on its host
    assert (tmp_path / "run" / "ps.log").read_text().strip()               # its log came back here
    return read_events(tmp_path / "run"), rounds, after_round_1(rounds)     # the PS's events.jsonl, copied here


def shard_door(tmp_path) -> tuple[list[dict], int, set[int]]:
    # Deadlines far beyond a round's work: on a loaded machine no site may be late at a shard (every
    # round must count all three), and a round whose deltas are all in commits without waiting for them.
    rounds = 5
    cfg = small_config(**{"sites": ["a", "b", "c"], "train.rounds": rounds, "train.inner_steps": 10,
                          "schedule.quorum_wait_s": 150.0, "schedule.deadline_min_s": 150.0,
                          "schedule.deadline_initial_s": 150.0})
    c = ShardedCluster(tmp_path, cfg, shards=2)
    killed = 1
    try:
        # Shard 1 holds every delta of round 2 and stalls aggregating it while shard 0 commits the
        # round; then it is killed. Killed while deltas still arrive, the shards could count
        # different sites: a site's streams to every shard end with one shard, and a shard that
        # took a site's whole delta before the others' streams broke commits without those
        # (twice in busy runs; issue 28's loss recovery is where a leaving site's delta is decided).
        for i in range(2):
            c.start_shard(i, *(("--stall", "aggregate@2=120") if i == killed else ())).wait_for("listening on")
        for name in cfg.sites:
            c.start_site(name)
        c.wait_shard_event(killed, "stall", round=2)
        c.wait_shard_event(1 - killed, "round_end", round=2)
        c.kill(c.shards[killed])
        c.start_shard(killed).wait_for("listening on")
        shards = c.finish()
    finally:
        c.close()
    other = shards[1 - killed]
    check_run(other, rounds)
    assert not rows(other, "restart")
    per_shard = [{e["round"]: (tuple(e["sites"]), tuple(e["late_sites"])) for e in rows(ev, "round_end")}
                 for ev in shards]
    assert per_shard[0] == per_shard[1]                                    # the same deltas counted ...
    assert all(e["sites"] == ["a", "b", "c"] for e in rows(other, "round_end"))      # ... and none lost
    return shards[killed], rounds, {2, 3}


DOORS = {"cluster-aggregate": lambda p, _: cluster_door(p, "aggregate@2"),
         "cluster-checkpoint": lambda p, _: cluster_door(p, "checkpoint@3"),
         "run": lambda p, _: run_door(p), "move": lambda p, _: move_door(p),
         "remote": lambda p, request: remote_door(p, request.getfixturevalue("venvs")),
         "shard": lambda p, _: shard_door(p)}


@pytest.mark.timeout(480)         # the remote door installs on two SSH hosts of a loaded machine
@pytest.mark.parametrize("door", list(DOORS))
def test_a_killed_ps_loses_no_round(tmp_path, door, request):
    # (only the remote door asks for the suite's install: the others need not wait for it)
    check_recovered(*DOORS[door](tmp_path, request))
