"""What a tutorial prints about its run, recounted from the run's own log.

Tutorials 03 and 04 print counts and times of the run they drove (rounds without a dark site,
what became of its delta, what each fault cost); tutorial 03's run is also the suite's run of a dark
site under the default late policy (tests/cluster.py: check_dark_site). Once nbmake has run one, conftest.py (at the
root) calls `check_claims` on the executed copy: the printed lines are parsed, the run folder
they name is read (`events.jsonl`), and every figure is counted again here, by code written apart
from the notebook's, so a tutorial cannot say more than its run did.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from wantrain.telemetry import read_events, rows

from .cluster import check_dark_site


def printed(executed: Path) -> str:
    nb = json.loads(executed.read_text())
    return "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")


def _find(pattern: str, text: str) -> re.Match:
    m = re.search(pattern, text)
    assert m, f"the tutorial did not print a line like {pattern!r}"
    return m


def _close(said: str, value: float, what: str) -> None:
    assert abs(float(said) - value) <= 0.051, f"{what}: printed {said}, the run's log says {value:.3f}"


def check_03(text: str, events: list[dict]) -> None:
    dark = _find(r"The link of (\S+) was dark for ([\d.]+) s, ([\d.]+) times the deadline of ([\d.]+) s", text)
    site = dark[1]
    start = next(e for e in events if e["kind"] == "outage_start" and e["site"] == site)
    end = next(e for e in events if e["kind"] == "outage_end" and e["site"] == site and e["t"] > start["t"])
    _close(dark[2], end["t"] - start["t"], "outage seconds")
    starts = rows(events, "round_start")
    deadline = [e["deadline_s"] for e in starts if e["t"] <= start["t"]][-1]     # in force when it went dark
    _close(dark[4], deadline, "the deadline in force")
    in_round = max(e["round"] for e in starts if e["t"] <= start["t"])
    ends = rows(events, "round_end")
    back = min(e["round"] for e in ends if e["round"] > in_round and site in e["sites"])
    missed = [e["round"] for e in ends if e["t"] > start["t"] and e["round"] < back and site not in e["sites"]]
    n = _find(rf"(\d+) rounds committed without {re.escape(site)} \(rounds (\d+) to (\d+)\)", text)
    assert (int(n[1]), int(n[2]), int(n[3])) == (len(missed), missed[0], missed[-1]), (n.group(0), missed)
    late = next(e for e in rows(events, "late_delta") if e["site"] == site and e["round"] >= in_round)
    fate = _find(r"Its delta of round (\d+) was (\w+): ", text)
    assert (int(fate[1]), fate[2]) == (late["round"], late["action"]), (fate.group(0), late)
    again = _find(r"It was counted again in round (\d+), ([\d.]+) s after its link came back; it joined the run "
                  r"(\d+) time", text)
    assert int(again[1]) == back, (again.group(0), back)
    _close(again[2], next(e["t"] for e in ends if e["round"] == back) - end["t"], "seconds until counted again")
    assert int(again[3]) == sum(1 for e in rows(events, "join") if e["site"] == site)


def check_03_run(events: list[dict], run_dir: Path) -> None:
    """Tutorial 03's run itself, as test_dark_site.py checks its runs under "drop": the dark site
    came back on its own stream, its delta handled by the default policy and its log saying so;
    what it pushed late went outside the outer momentum of one later commit."""
    site = rows(events, "outage_start")[0]["site"]
    rounds = json.loads((run_dir / "config.json").read_text())["train"]["rounds"]
    check_dark_site(events, site, (run_dir / f"site-{site}.log").read_text(), rounds, {"deferred", "dropped", "kept"})
    deferred = [e for e in rows(events, "late_delta") if e["site"] == site and e["action"] == "deferred"]
    reconciled = [k for e in rows(events, "round_end") for k in e["reconciled"]]
    assert all(reconciled.count(f"{site}@{e['round']}") == 1 for e in deferred), (deferred, reconciled)


def check_04(text: str, events: list[dict]) -> None:
    ends = rows(events, "round_end")
    said = _find(r"rounds committed: \[([\d, ]*)\]", text)
    assert [int(x) for x in said[1].split(",")] == [e["round"] for e in ends]
    checks = rows(events, "hash_check")
    said = _find(r"replica hash checks: (\d+), mismatches: (\d+)", text)
    assert (int(said[1]), int(said[2])) == (len(checks), sum(not c["ok"] for c in checks))
    first = {}
    for e in rows(events, "round_start"):
        first.setdefault(e["round"], e["t"])
    took = {e["round"]: e["t"] - first[e["round"]] for e in ends}
    faults = rows(events, "fault")
    hit = {e["round"] for e in ends for f in faults if first[e["round"]] - 1 <= f["t"] <= e["t"]}
    calm = [r for r in took if r > 0 and r not in hit]
    said = _find(r"a round no fault touched took ([\d.]+) s from its start to its commit \(median of (\d+)\)", text)
    _close(said[1], statistics.median(took[r] for r in calm), "calm median")
    assert int(said[2]) == len(calm)
    touched = [(int(m[1]), m[2]) for m in re.finditer(r"round (\d+), with a fault \([^)]*\), took ([\d.]+) s", text)]
    assert sorted(r for r, _ in touched) == sorted(hit), (touched, hit)
    for r, seconds in touched:
        _close(seconds, took[r], f"round {r} from its first start to its commit")
    ready = _find(r"the killed site had the model again ([\d.]+) s after it rejoined", text)
    rejoin = [e for e in rows(events, "ready") if e["since_join_s"] is not None]
    assert any(abs(float(ready[1]) - e["since_join_s"]) <= 0.051 for e in rejoin), (ready.group(0), rejoin)


CLAIMS = {"03-wan-traces": check_03, "04-faults": check_04}
RUNS = {"03-wan-traces": check_03_run}          # beside its claims, the run checked as a test would


def check_claims(executed: Path) -> bool:
    """Recount what the executed tutorial printed about its run; False if it is not one that prints any."""
    check = CLAIMS.get(executed.stem)
    if check is None:
        return False
    text = printed(executed)
    run_dir = Path(_find(r"run folder: (\S+)", text)[1])
    if not run_dir.is_absolute():
        run_dir = executed.parents[2] / "notebooks" / run_dir
    events = read_events(run_dir)
    check(text, events)
    if executed.stem in RUNS:
        RUNS[executed.stem](events, run_dir)
    return True
