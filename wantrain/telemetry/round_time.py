"""Where each site's round goes: a round's wall time, split into what filled it.

A round, for one site, is the PS's clock from its `round_start` to the next round's (the last
round ends at its `round_end`). The PS sends the previous round's update just before that start,
so in order the site's round holds:

    latency      in flight: the update's first chunk on its way to the site and the delta's first
                 chunk on its way back (queueing behind other messages included): from the round's
                 start to that chunk's arrival at the PS (`first_in_s`), less the site's own time
                 between the two (`turnaround_s`, on the site's clock: no clocks need agree)
    download     the update it starts from, first chunk to result, at the site (`download_s`)
    apply        decoding and adding that update (`decode_s`)
    compute      the inner steps (`compute_s`; under the overlap schedule, only the steps taken after
                 the RoundStart: those taken ahead fill the previous round's waiting)
    encode       the codec (`encode_s`)
    other        the rest of the site's turnaround: what none of its timers measured (checking the
                 update's hash, drawing batches, handing over the manifest)
    upload       the delta's first chunk to its last, at the PS (`upload_s`)
    waiting      its last chunk in to the round closing: the other sites (`arrived_s`, `closed_s`)
    ps           the round closing to the next round's start: screening, aggregation, the outer
                 step, encoding the update, evaluation, the journal

The parts add up to the wall time by construction, except `other`, which is what the site's
timers left unexplained: small when they are the whole story. A site whose delta came after its
round closed has no split for that round (it did not take part in its close).
`telemetry.utilization` is computing over the same windows (`telemetry.round_windows`), steps
taken ahead included.
"""

from __future__ import annotations

from . import round_windows, rows

__all__ = ["PARTS", "LABELS", "round_splits", "site_totals", "summary_lines"]

PARTS = ("latency", "download", "apply", "compute", "encode", "other", "upload", "waiting", "ps")
LABELS = {"latency": "in flight", "download": "downloading the update", "apply": "applying the update",
          "compute": "computing", "encode": "encoding", "other": "not measured", "upload": "uploading the delta",
          "waiting": "waiting for the others", "ps": "at the PS (aggregate, update, evaluate)"}


def round_splits(events: list[dict]) -> list[dict]:
    """One row per site and round it took part in: `round`, `site`, `wall_s` and `<part>_s` for
    each of PARTS, in seconds; they sum to `wall_s`. A part is negative only where its timers
    overlap: `other` when the site's parts overlap (steps taken ahead under the overlap schedule),
    `waiting` when the round closed before the delta's last chunk (counted in part)."""
    windows = round_windows(events)
    ends = {e["round"]: e for e in rows(events, "round_end")}
    out = []
    for e in rows(events, "site_round"):
        r, site = e["round"], e["site"]
        end = ends.get(r)
        if e.get("late") or e.get("first_in_s") is None or r not in windows or end is None or "closed_s" not in end:
            continue            # (a log from before these fields, or a delta that missed its round)
        t0, t1 = windows[r]
        ahead = e["steps_ahead"] / e["steps"] if e["steps"] else 0.0
        site_parts = {"download_s": e["download_s"], "apply_s": e["decode_s"], "compute_s": e["compute_s"] * (1 - ahead),
                      "encode_s": e["encode_s"]}
        out.append({"round": r, "site": site, "wall_s": t1 - t0,
                    "latency_s": e["first_in_s"] - e["turnaround_s"], **site_parts,
                    "other_s": e["turnaround_s"] - sum(site_parts.values()),
                    "upload_s": e["arrived_s"] - e["first_in_s"],
                    "waiting_s": end["closed_s"] - e["arrived_s"],
                    "ps_s": t1 - t0 - end["closed_s"]})
    return out


def site_totals(splits: list[dict]) -> dict[str, dict[str, float]]:
    """Per site, each part's seconds and the wall time summed over its rounds, and `rounds`."""
    out: dict[str, dict[str, float]] = {}
    for s in splits:
        d = out.setdefault(s["site"], {"rounds": 0, "wall_s": 0.0, **{f"{p}_s": 0.0 for p in PARTS}})
        d["rounds"] += 1
        for k in ("wall_s", *(f"{p}_s" for p in PARTS)):
            d[k] += s[k]
    return out


def summary_lines(events: list[dict]) -> list[str]:
    """One line per site: its rounds' wall time and each part's share of it, largest first."""
    lines = []
    for site, d in site_totals(round_splits(events)).items():
        shares = sorted(((d[f"{p}_s"] / d["wall_s"], p) for p in PARTS if p != "other"), reverse=True)
        lines.append(f"where {site}'s time went ({d['rounds']} rounds, {d['wall_s']:.1f} s): "
                     + ", ".join(f"{LABELS[p]} {share:.1%}" for share, p in shares if share >= 0.0005)
                     + f"; not measured {d['other_s'] / d['wall_s']:+.1%}")
    return lines
