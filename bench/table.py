"""The data-path figures of issue 12 side by side: as the issue measured them, as this machine
measures them now (bench/results/*.json, written by the benchmarks `make bench` has just run),
and the goal. A figure whose benchmark did not run says so; one that nothing measures yet says so.

    python bench/table.py
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def server(fmt: str) -> Callable[[], str | None]:
    def get() -> str | None:
        r = load("server")
        if r is None or r.get("preset") != "gpt2":
            return None
        return fmt.format(**r["durable"], **{"vs_none": r["round_durable_vs_none"],
                                             "raw": r["raw_tcp_loopback_MBps"], "none": r["no_durability"]})
    return get


def codec(fmt: str) -> Callable[[], str | None]:
    def get() -> str | None:
        r = load("codec")
        if r is None:
            return None
        s = r["results"][max(r["results"])]["MBps_per_core"]    # the delta after the most inner steps
        return fmt.format(enc=s["huffman encode"], dec=s["huffman decode"], np_enc=s["numpy huffman encode (before)"],
                          np_dec=s["numpy huffman decode (before)"], z_enc=s["zstd1 compress"], z_dec=s["zstd1 decompress"])
    return get


def shards() -> str | None:
    r = load("shard_ingest")
    if r is None:
        return None
    arms = ", ".join(f"{a['shards']}: {a['ingest_MBps_median']:.0f} ({a['vs_one_shard']:.2f}x)" for a in r["arms"])
    return f"{arms} MB/s ({r['preset']}, {r['cores']} cores for shards and clients together)"


def device_codec() -> str | None:
    r = load("device_codec_cuda") or load("device_codec_cpu")
    if r is None:
        return None
    m = r["MBps"]
    return (f"torch on {r['device']}: encode {m['torch encode']:.0f}, decode {m['torch decode']:.0f} MB/s "
            f"(compiled CPU {m['compiled encode']:.0f} / {m['compiled decode']:.0f}), bytes identical")


def restart() -> str | None:
    r = load("site_restart")
    if r is None:
        return None
    m = r["median"]
    return (f"{m['start_to_ready_s']:.1f} s to ready ({r['preset']}: join {m['start_to_join_s']:.1f} + "
            f"{m['join_to_ready_s']:.1f}); floor (torch + AdamW) {r['floor_s']:.1f} s")


def large() -> str | None:
    r = load("large_model_llama3-1b")
    if r is None or "round_s" not in r:
        return None
    return f"{r['round_s']:.0f} s (one site), peak {r['ps_peak_during_round_x_model']:.1f}x the fp32 model"


def aggregate() -> str | None:
    r = load("aggregate")
    if r is None:
        return None
    m = r["median_s"]
    return f"{m['compiled']:.1f} s alone (numpy step {m['numpy']:.1f} s: {r['speedup']:.1f}x), {r['cores']} cores"


def utilization() -> str | None:
    r = load("time_to_target")
    if r is None:
        return None
    util = {arm: a["utilization"] for arm, a in r["arms"].items()}
    fixed = util.get("diloco-int8-huffman", {})
    parts = []
    if fixed:
        fastest = min(fixed, key=fixed.get)
        parts.append(f"fixed steps: fastest site {fixed[fastest]:.1%}")
    for arm in ("time-budget", "overlap"):
        if arm in util:
            parts.append(f"{arm}: least busy {min(util[arm].values()):.1%}, slowest link "
                         f"{util[arm].get(r['slowest_site'], 0):.1%}")
    return "; ".join(parts) + f" ({r['size']} harness, {r['seeds']} seed(s))"


def catchup() -> str | None:
    r = load("time_to_target")
    arms = r["arms"] if r else {}
    if "diloco-fp32" not in arms or "diloco-int8-huffman" not in arms:
        return None
    down = {a: (arms[a]["mb"] - arms[a]["uplink_mb"]) / arms[a]["rounds"][0] for a in ("diloco-fp32",
                                                                                        "diloco-int8-huffman")}
    return (f"a rejoin that kept its replica: {down['diloco-int8-huffman'] / down['diloco-fp32']:.2f} of the model "
            "per missed round (catch-up, up to half the model; else the full fp32 model, one stream)")


def check_cost() -> str | None:
    r = load("check_cost")
    if r is None:
        return None
    return "; ".join(f"{x['preset']} +{x['check_extra_s']:.2f} s a round, {x['share_of_round']:.1%} of it "
                     f"(saved state {x['saved_gb']:.2f} GB)" for x in r["rows"])


def robustness() -> str | None:
    r = load("robustness")
    if r is None:
        return None
    two = [x for x in r["rows"] if x["sites"] == 2 and x.get("goal") is not None and x["attack"] != "honest"]
    if not two:
        return None
    worst = max(two, key=lambda x: x["vs_absent"])
    honest = next((x for x in r["rows"] if x["sites"] == 2 and x["attack"] == "honest"), None)
    return (f"worst attack {worst['attack']} {worst['vs_absent']:+.2%} vs the honest site alone; honest deltas left "
            f"out {honest['honest_rejected'] if honest else '?'}")


ROWS: list[tuple[str, str, Callable[[], str | None], str]] = [
    ("PS round, gpt2, 3 sites", "20.7 s", server("{ps_round_s_median:.1f} s"), "<= 2 s"),
    ("  checkpoint in the round", "8.4-10.2 s before the announce",
     server("background ({checkpoint_s_median:.1f} s); round {vs_none:.2f}x one without "
            "durability"), "off the critical path"),
    ("  aggregate + outer step + encode", "5.4 s (encode 3.5)",
     server("{aggregate_s_median:.1f} s (encode {update_encode_s_summed_median:.1f} summed)"),
     "about 1 s"),
    ("  the same, alone (bench/aggregate_bench.py)", "", aggregate, "about 1 s"),
    ("PS peak memory, gpt2 round", "4.7 GB", server("{ps_peak_rss_MB:.0f} MB"), "<= 2.5 GB"),
    ("PS round, llama3-1b", "183 s (one site)", large, "<= 20 s, 3 sites"),
    ("PS ingest, 3 sites", "401-438 MB/s",
     server("{ingest_MBps_median:.0f} MB/s (raw TCP here {raw:.0f})"), ">= 1 GB/s"),
    ("  with N PS shards (bench/shard_ingest.py)", "one PS", shards, "N shards ~ N x one"),
    ("Huffman encode / decode per core", "78-82 / 114-119 MB/s",
     codec("{enc:.0f} / {dec:.0f} MB/s (numpy {np_enc:.0f} / {np_dec:.0f}, zstd-1 {z_enc:.0f} / {z_dec:.0f})"),
     ">= 300 / 300"),
    ("codec on a site's GPU (bench/device_codec.py)", "none (CPU only)", device_codec, "encode and decode there"),
    ("site restart (SIGKILL) to ready to train, tiny", "4.7-6.7 s", restart, "<= 3 s"),
    ("site compute utilization (time-to-target harness)", "fastest site 47.6 %", utilization,
     "every site >= 90 %; slowest link with overlap >= 95 %"),
    ("bytes to a joining site", "full fp32, one stream", catchup, "link rate, fewer bytes"),
    ("two sites, one hostile or broken (bench/robustness.py)", "escalating 380.1 (issue 55)", robustness,
     "every attack within 2 % of the honest site alone, no honest delta left out"),
    ("commit check per round (bench/check_cost.py)", "no check", check_cost, "stated and bounded"),
]


def main() -> int:
    rows = [(name, before, get() or "benchmark not run", goal) for name, before, get, goal in ROWS]
    widths = [max(len(r[i]) for r in [("figure", "issue 12 (before)", "now (this run)", "goal"), *rows])
              for i in range(4)]
    for r in [("figure", "issue 12 (before)", "now (this run)", "goal"), tuple("-" * w for w in widths), *rows]:
        print(" | ".join(c.ljust(w) for c, w in zip(r, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
