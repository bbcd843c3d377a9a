"""A run's story in rows and lines, from its events: the settings it ran with, a row per round, and
what happened to it besides its rounds. The HTML report, `wantrain demo`'s closing table and the
TensorBoard text log all read these, so each says the same thing the same way."""

from __future__ import annotations

from . import on_wire, rows

__all__ = ["INCIDENT_KINDS", "describe", "incidents", "round_rows", "settings"]

# What happened to a run besides its rounds: listed in the report, marked on its timeline.
INCIDENT_KINDS = ("join", "leave", "deadline", "late_delta", "quarantine", "alert", "restart", "fault",
                  "outage_start", "outage_end", "error")


def describe(e: dict) -> str:
    """One event, as a sentence for a person."""
    kind = e["kind"]
    if kind == "join":
        return f"{e['site']} joined" + (" (resumed)" if e.get("resumed") else "")
    if kind == "deadline":
        return f"round {e['round']}: deadline passed without {', '.join(e['missing'])}"
    if kind == "late_delta":
        return f"{e['site']}: delta of round {e['round']} {e['action']}"
    if kind == "leave":
        return f"{e['site']} left: {e['reason']}"
    if kind == "restart":
        return f"PS restarted from its checkpoint at round {e['round']}"
    if kind == "fault":
        return (f"fault injected: {e['action']} {e.get('site', '')}".strip()
                + (f" for {e['seconds']:g} s" if "seconds" in e else ""))
    if kind in ("alert", "quarantine"):
        return f"round {e['round']}: {e['message']}"
    if kind == "outage_start":
        return f"outage {e['site']}" + (" (forced now)" if e.get("forced") else "")
    if kind == "outage_end":
        return f"{e['site']}'s link back"
    if kind == "error":
        return f"error: {e['message']}"
    return f"{kind} {e.get('site', '')}".strip()


def incidents(events: list[dict]) -> list[tuple[float, str]]:
    """(seconds since start, what happened) for every incident, in order."""
    return [(e["elapsed_s"], describe(e)) for e in events if e["kind"] in INCIDENT_KINDS]


def round_rows(events: list[dict]) -> list[dict]:
    """A row per committed round: `round`, `val_loss`, `round_s` (start to commit), `counted`
    (sites whose delta it used), `late` (late deltas it applied), `missed` (sites it went on
    without), `uplink_mb` (every byte of every site's delta of that round: telemetry.on_wire),
    `uplink_ratio` (times smaller than fp32), `huffman_bits` (mean bits per symbol, 0 without Huffman), `downlink_mb` (the update, per
    site) and `close` (why the round closed)."""
    by_round: dict[int, list[dict]] = {}
    for e in rows(events, "site_round"):
        by_round.setdefault(e["round"], []).append(e)
    out = []
    for e in rows(events, "round_end"):
        ups = by_round.get(e["round"], [])
        wire = sum(on_wire(u) for u in ups)
        raw = sum(u["raw_bytes"] for u in ups)
        out.append({"round": e["round"], "val_loss": e["val_loss"], "round_s": e["round_s"],
                    "counted": len(e["sites"]), "late": len(e["late_sites"]), "missed": len(e["missed"]),
                    "uplink_mb": wire / 1e6, "uplink_ratio": raw / wire if wire else 0.0,
                    "huffman_bits": sum(u["huffman_bits_per_symbol"] for u in ups) / len(ups) if ups else 0.0,
                    "downlink_mb": on_wire(e) / 1e6, "close": e.get("close", "complete")})
    return out


def settings(events: list[dict]) -> list[tuple[str, str]]:
    """The settings a reader needs to make sense of the run's figures, from its run_start."""
    start = rows(events, "run_start")
    if not start:
        return []
    c = start[0]["config"]
    t, codec = c["train"], c["codec"]
    # (a run from before the config's split kept schedule and recovery in `train`)
    mode, recovery = c["schedule"]["mode"] if "schedule" in c else t["schedule"], c.get("recovery", t)
    work = (f"{t['round_budget_s']:g} s of compute a round" if t["round_budget_s"]
            else f"{t['inner_steps']} inner steps a round")
    down = codec["update_mode"] or codec["mode"]
    return [
        ("sites", ", ".join(c["sites"]) or str(c["num_sites"])),
        ("model", f"{c['model']['preset']} ({start[0].get('num_params', 0) / 1e6:.2f} M parameters), "
                  f"block {c['model']['block_size']}, batch {t['batch_size']}"),
        ("rounds", f"{t['rounds']} x {work}, schedule {mode}"),
        ("optimizers", f"inner AdamW lr {t['inner_lr']:g}; outer Nesterov lr {t['outer_lr']:g}, "
                       f"momentum {t['outer_momentum']:g}"),
        ("codec", f"{codec['mode']} up, {down} down" + (", error feedback" if codec["error_feedback"] else "")),
        ("deadlines", f"late deltas: {recovery['late_policy']}; partial deltas "
                      f"{'on' if recovery['partial_deltas'] else 'off'}, loss budget {recovery['loss_budget']:.0%}"),
        ("corpus", f"{c['data']['corpus']}, tokenizer {c['data']['tokenizer']}"),
    ]
