"""A PS and its sites as real processes, for fault-injection and soak tests."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

from wantrain.config import RunConfig
from wantrain.launch.argv import ps_args, site_args
from wantrain.telemetry import read_events, rows

from .helpers import Proc, free_port


class Cluster:
    """Starts, kills (SIGKILL) and restarts a PS and named sites; always cleans up."""

    def __init__(self, tmp: Path, cfg: RunConfig, ps_args: tuple[str, ...] = (), site_args: tuple[str, ...] = ()):
        self.tmp, self.cfg = tmp, cfg
        (tmp / "config.json").write_text(cfg.to_json())
        self.port = free_port()
        self.run_dir = tmp / "run"
        self.ps_args, self.site_args = ps_args, site_args
        self.procs: list[Proc] = []
        self.ps: Proc | None = None
        self.sites: dict[str, Proc] = {}
        self.starts = 0

    def _proc(self, label: str, *args: str) -> Proc:
        self.starts += 1
        p = Proc(*args, log=self.tmp / f"{label}-{self.starts}.log")
        self.procs.append(p)
        return p

    def start_ps(self, *extra: str) -> Proc:
        self.ps = self._proc("ps", *ps_args(self.tmp / "config.json", port=self.port, run_dir=self.run_dir),
                             *self.ps_args, *extra)
        return self.ps

    def start_site(self, name: str, *extra: str) -> Proc:
        self.sites[name] = self._proc(name, *site_args(f"127.0.0.1:{self.port}", name, threads=1,
                                                       extra=(*self.site_args, *extra)))
        return self.sites[name]

    def start(self) -> Cluster:
        self.start_ps().wait_for("listening on")
        for name in self.cfg.sites:
            self.start_site(name)
        return self

    @staticmethod
    def kill(p: Proc) -> float:
        os.killpg(p.p.pid, signal.SIGKILL)
        p.p.wait(10)
        return time.time()

    def events(self) -> list[dict]:
        path = self.run_dir / "events.jsonl"
        return read_events(path) if path.exists() else []

    def wait_event(self, kind: str, timeout: float = 120, **match) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for e in rows(self.events(), kind):
                if all(e.get(k) == v for k, v in match.items()):
                    return e
            time.sleep(0.1)
        raise AssertionError(f"no {kind} event matching {match} within {timeout} s")

    def finish(self, timeout: float = 300) -> list[dict]:
        """Wait until every live site and the PS exit 0; returns the run's events."""
        deadline = time.time() + timeout
        for p in [*self.sites.values(), self.ps]:
            code = p.p.wait(max(1, deadline - time.time()))
            assert code == 0, f"{p.log.name} exited {code}:\n{p.text()[-3000:]}"
        return self.events()

    def close(self) -> None:
        for p in self.procs:
            p.kill()


class ShardedCluster(Cluster):
    """A PS of `shards` processes (shard i on its own port and run folder) and named sites that dial all."""

    def __init__(self, tmp: Path, cfg: RunConfig, shards: int, **kw) -> None:
        super().__init__(tmp, cfg, **kw)
        self.ports = [self.port] + [free_port() for _ in range(shards - 1)]
        self.run_dirs = [tmp / f"shard-{i}" for i in range(shards)]
        self.shards: list[Proc | None] = [None] * shards

    def start_shard(self, i: int, *extra: str) -> Proc:
        p = self._proc(f"ps{i}", *ps_args(self.tmp / "config.json", port=self.ports[i], run_dir=self.run_dirs[i],
                                             shard=f"{i}/{len(self.ports)}", run_id="sharded-run",
                                             report_to=f"127.0.0.1:{self.ports[0]}" if i else None),
                       *self.ps_args, *extra)
        self.shards[i] = self.ps = p
        return p

    def start_site(self, name: str, *extra: str) -> Proc:
        ps = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        self.sites[name] = self._proc(name, *site_args(ps, name, threads=1, extra=(*self.site_args, *extra)))
        return self.sites[name]

    def start(self) -> ShardedCluster:
        for i in range(len(self.ports)):
            self.start_shard(i).wait_for("listening on")
        for name in self.cfg.sites:
            self.start_site(name)
        return self

    def shard_events(self, i: int) -> list[dict]:
        path = self.run_dirs[i] / "events.jsonl"
        return read_events(path) if path.exists() else []

    def wait_shard_event(self, i: int, kind: str, timeout: float = 120, **match) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for e in rows(self.shard_events(i), kind):
                if all(e.get(k) == v for k, v in match.items()):
                    return e
            time.sleep(0.1)
        raise AssertionError(f"no {kind} event matching {match} from shard {i} within {timeout} s")

    def finish(self, timeout: float = 300) -> list[list[dict]]:
        """Wait until every live site and every shard exit 0; returns each shard's events."""
        deadline = time.time() + timeout
        for p in [*self.sites.values(), *self.shards]:
            assert p is not None
            code = p.p.wait(max(1, deadline - time.time()))
            assert code == 0, f"{p.log.name} exited {code}:\n{p.text()[-3000:]}"
        return [self.shard_events(i) for i in range(len(self.ports))]


def check_run(events: list[dict], rounds: int) -> None:
    """Training completed, every committed round exactly once, all replicas bit-identical."""
    ends = [e["round"] for e in rows(events, "round_end")]
    assert ends == list(range(rounds)), f"rounds committed: {ends}"          # none lost, none twice
    assert rows(events, "run_end"), "the run did not finish"
    hashes = {e["round"]: e["model_hash"] for e in rows(events, "round_end")}
    checks = rows(events, "hash_check")
    assert checks and all(c["ok"] for c in checks), [c for c in checks if not c["ok"]]
    assert all(c["site_hash"] == hashes[c["round"]] for c in checks)
    final = [c for c in checks if c["round"] == rounds - 1]
    assert final, "no site confirmed the final model"
    # One clock for the run, across PS restarts: every event's elapsed_s counts from the same start.
    starts = [e["t"] - e["elapsed_s"] for e in events]
    assert max(starts) - min(starts) < 1e-3, f"the run's clock restarted: starts {sorted(set(starts))[:4]}"


def check_dark_site(events: list[dict], dark: str, log: str, rounds: int, actions: set[str]) -> None:
    """A site whose link went dark for longer than a deadline came back on its own stream: no
    disconnect, no model download, its delta handled by `actions`, its log saying why."""
    check_run(events, rounds)                          # every round once, every replica check equal
    # No disconnect and no model download: each site joined once, and nobody left or resynced.
    assert sorted(e["site"] for e in rows(events, "join")) == sorted({e["site"] for e in rows(events, "join")})
    end = rows(events, "run_end")[0]["t"]
    trouble = [e for e in events if e["kind"] in ("leave", "catchup", "error") and e["t"] < end]
    assert not trouble, trouble
    outages = [e for e in rows(events, "outage_start") if e["site"] == dark]
    lates = [e for e in rows(events, "late_delta") if e["site"] == dark]
    assert len(outages) >= 1 and len(lates) >= len(outages), (outages, lates)
    for out in outages:
        # The round the site was in when its link went dark: its delta is handled by the policy.
        owed = max(e["round"] for e in rows(events, "round_start") if e["t"] <= out["t"])
        late = next(e for e in lates if e["round"] >= owed)
        assert late["action"] in actions and late["reason"], late
        # Once it owed that delta, no round started counting on it until it was back.
        back = next(e for e in rows(events, "round_end") if e["round"] > late["round"] and dark in e["sites"])
        during = [e for e in rows(events, "round_start") if late["round"] < e["round"] <= back["round"]
                  and e["t"] < late["t"]]
        assert during and all(dark not in e["sites"] and dark in e["dark"] for e in during), during
        # Its log names what became of that round's delta, and why.
        said = [ln for ln in log.splitlines() if re.search(rf"round {late['round']}\b", ln)
                and ("committed without this site's delta" in ln or "the delta of round" in ln)]
        assert said and any("late_policy" in ln or "deadline" in ln for ln in said), (late, said)
