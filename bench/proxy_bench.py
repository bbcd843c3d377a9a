"""The link proxy's own cost: throughput it carries unshaped, and CPU seconds per GB forwarded.

Side by side in one run: the same bytes sent straight to the sink (baseline) and through an
unshaped LinkProxy (all in one process: sender, proxy and sink share one event loop, so the
CPU time is the proxy's cost plus the endpoints', and the baseline is the endpoints' alone).

    python bench/proxy_bench.py [--mb 512]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import save

from testbed import LinkProxy, Trace


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def transfer(total: int, via_proxy: bool) -> tuple[float, float]:
    done = asyncio.Event()
    got = 0

    async def sink(r, w):
        nonlocal got
        while data := await r.read(1 << 20):
            got += len(data)
        done.set()
        w.close()

    server = await asyncio.start_server(sink, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = None
    if via_proxy:
        proxy = LinkProxy(("127.0.0.1", port), Trace.constant(0, math.inf))
        port = await proxy.start()
    r, w = await asyncio.open_connection("127.0.0.1", port)
    block = b"\0" * (1 << 20)
    c0, t0 = cpu_s(), time.perf_counter()
    sent = 0
    while sent < total:
        w.write(block)
        sent += len(block)
        await w.drain()
    w.close()
    await done.wait()
    dt, dc = time.perf_counter() - t0, cpu_s() - c0
    if proxy:
        await proxy.stop()
    server.close()
    return got / dt / 1e6, dc / (got / 1e9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=512)
    args = ap.parse_args()
    total = args.mb << 20
    base_mbps, base_cpu = asyncio.run(transfer(total, False))
    prox_mbps, prox_cpu = asyncio.run(transfer(total, True))
    result = {"MB": args.mb, "direct_MBps": base_mbps, "direct_cpu_s_per_GB": base_cpu,
              "proxy_MBps": prox_mbps, "proxy_cpu_s_per_GB": prox_cpu,
              "proxy_added_cpu_s_per_GB": prox_cpu - base_cpu, "throughput_ratio": prox_mbps / base_mbps}
    print(f"direct: {base_mbps:.0f} MB/s, {base_cpu:.2f} CPU s/GB; through the proxy (unshaped): "
          f"{prox_mbps:.0f} MB/s, {prox_cpu:.2f} CPU s/GB")
    print(f"proxy/direct throughput {prox_mbps / base_mbps:.2f}; CPU the proxy adds: "
          f"{prox_cpu - base_cpu:.2f} s per GB forwarded")
    print("wrote", save("proxy", result))


if __name__ == "__main__":
    main()
