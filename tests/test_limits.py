"""Findings 3, 4 and 7: what one peer can make the PS do is bounded.

A second PS cannot take over the port; model downloads are not amplified by hash reports; a
flood of idle connections, with the PS at a common open-file limit, does not lock real sites
out; a Session that never joins is timed out, and streams per peer address are capped.
"""

import asyncio
import resource
import socket
import time

import grpc
import pytest

from wantrain.transport import net, wire
from wantrain.errors import ProtocolError, RejectedError
from wantrain.transport.limits import Limits, Throttle, TokenBucket, safe_text
from wantrain.transport.messages import HashReport, Join
from wantrain.ps import ParameterServer
from wantrain.ps.connections import ConnectionGuard, peer_address
from wantrain.telemetry import read_events
from wantrain.launch.argv import ps_args

from .helpers import Proc, free_port, small_config, wantrain
from .test_hostile import HandSite
from .test_server import delta_chunks, drain, enter, rows_of


@pytest.fixture(scope="module")
def ps(tmp_path_factory):
    """A plaintext PS that waits for two sites that never come (so nothing commits)."""
    tmp = tmp_path_factory.mktemp("limits")
    (tmp / "c.json").write_text(small_config(num_sites=2, sites=["a", "b"]).to_json())
    port = free_port()
    proc = Proc(*ps_args(tmp / "c.json", port=port, run_dir=tmp / "run"),
                "--join-timeout", "5", "--max-streams-per-peer", "8", log=tmp / "ps.log")
    proc.wait_for("listening on")
    yield port, proc, tmp
    proc.kill()


@pytest.mark.timeout(120)
def test_a_second_ps_cannot_bind_the_same_port(ps, tmp_path):
    """Finding 3: gRPC's default SO_REUSEPORT let two PS processes split the sites between them."""
    port, proc, tmp = ps
    r = wantrain(*ps_args(tmp / "c.json", port=port, run_dir=tmp_path / "run2"),
                 timeout=90)
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("wantrain ps: cannot listen on 127.0.0.1:") and "in use" in last, r.stderr
    assert "Traceback" not in r.stderr
    assert proc.p.poll() is None


@pytest.mark.timeout(120)
def test_a_port_held_by_another_program_is_one_clear_line(tmp_path):
    """Finding 10: a port held by another program gave a 29-line traceback."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        (tmp_path / "c.json").write_text(small_config().to_json())
        r = wantrain(*ps_args(tmp_path / "c.json", port=port, run_dir=tmp_path / "run"), timeout=90)
    assert r.returncode == 2 and "in use" in r.stderr and "Traceback" not in r.stderr, r.stderr


def raw_session(port: int, messages: list[bytes], timeout: float = 30) -> grpc.RpcError | None:
    """A Session carrying the given bytes; its final status (None if it ended OK)."""
    with net.channel(f"127.0.0.1:{port}") as ch:
        call = ch.stream_stream("/wantrain.v1.ParameterServer/Session", request_serializer=lambda b: b,
                                response_deserializer=lambda b: b)
        try:
            for _ in call(iter(messages) if messages else _never(timeout), timeout=timeout):
                pass
        except grpc.RpcError as e:
            return e
    return None


def _never(seconds: float):
    """A request stream that stays open and sends nothing."""
    time.sleep(seconds)
    return
    yield


@pytest.mark.timeout(60)
def test_a_session_that_never_joins_is_timed_out(ps):
    """Finding 7: Session streams that never send a Join were never timed out."""
    port, proc, _ = ps
    t0 = time.time()
    err = raw_session(port, [], timeout=30)
    assert err is not None and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err
    assert "no Join within 5 s" in err.details() and time.time() - t0 < 25


@pytest.mark.timeout(60)
def test_streams_per_peer_address_are_capped(ps):
    port, proc, _ = ps
    results: list = [None] * 12
    chans = [net.channel(f"127.0.0.1:{port}")
             for _ in range(3)]
    try:
        calls = []
        for i in range(12):                      # 12 silent Sessions from one address; the PS allows 8
            session = chans[i % 3].stream_stream("/wantrain.v1.ParameterServer/Session",
                                                 request_serializer=lambda b: b, response_deserializer=lambda b: b)
            calls.append(session(_never(12), timeout=30))    # the first 8 stay open for the join timeout
            time.sleep(0.05)
        for i, call in enumerate(calls):
            try:
                list(call)
            except grpc.RpcError as e:
                results[i] = e.code()
    finally:
        for ch in chans:
            ch.close()
    assert results.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 4, results
    assert results.count(grpc.StatusCode.DEADLINE_EXCEEDED) == 8, results
    assert proc.p.poll() is None


@pytest.mark.timeout(60)
def test_hash_reports_do_not_amplify_into_downloads(ps):
    """Finding 4: 200 hash reports with a wrong hash queued 201 full model downloads and 2,000 events."""
    port, proc, tmp = ps
    join = wire.site_message(Join("a")).SerializeToString()
    report = wire.site_message(HashReport(0, "0" * 16)).SerializeToString()
    before = len(read_events(tmp / "run"))
    err = raw_session(port, [join] + [report] * 200)
    assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT and "not been committed" in err.details()
    time.sleep(0.5)
    new = read_events(tmp / "run")[before:]
    assert len([e for e in new if e["kind"] == "join"]) == 1 and len(new) < 20, [e["kind"] for e in new]


@pytest.mark.timeout(120)
def test_a_resync_is_one_download_however_many_reports_ask_for_it(tmp_path):
    async def scenario():
        ps = ParameterServer(small_config(num_sites=1, **{"train.rounds": 4}), run_dir=tmp_path)
        a = enter(ps, Join("a"))
        for r in range(2):
            drain(a)
            msgs, m = delta_chunks(ps, r, seed=r)
            for c in msgs:
                ps.on_chunk(a, c)
            await ps.on_metrics(a, m)
            await ps.round_task
        drain(a)
        ps.on_hash_report(a, HashReport(0, "0" * 16))      # wrong: the PS resyncs the site ...
        ps.on_hash_report(a, HashReport(1, "0" * 16))      # ... once, whatever reports follow
        with pytest.raises(ProtocolError, match="after one for round 1"):
            ps.on_hash_report(a, HashReport(1, "0" * 16))
        with pytest.raises(ProtocolError, match="not been committed"):
            ps.on_hash_report(a, HashReport(5, "0" * 16))
        return ps, drain(a)
    ps, sent = asyncio.run(scenario())
    assert sum(type(m).__name__ == "Welcome" for m in sent) == 1
    assert len(rows_of(ps, "hash_check")) == 1


@pytest.mark.timeout(60)
def test_each_site_gets_a_bounded_number_of_downloads(tmp_path):
    ps = ParameterServer(small_config(num_sites=1), run_dir=tmp_path,
                         limits=Limits(downloads_per_site=2, download_bytes_per_site=1))
    for _ in range(2):
        ps.leave(ps.join(Join("a")), "gone")
    with pytest.raises(RejectedError, match="downloaded the model 2 times") as info:
        ps.join(Join("a"))
    assert info.value.code == "rate_limited"


def test_rate_limits_and_safe_text():
    now = [0.0]
    bucket = TokenBucket(3, 1.0, clock=lambda: now[0])
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]
    now[0] = 2.0
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    throttle = Throttle(1, 0.5, keys=2, clock=lambda: now[0])
    assert throttle.allow("x") and not throttle.allow("x") and not throttle.allow("x")
    assert throttle.take_suppressed("x") == 2 and throttle.take_suppressed("x") == 0
    throttle.allow("y"), throttle.allow("z")
    assert "x" not in throttle.buckets                     # at most `keys` peers are remembered
    assert safe_text("cpu\n2026 INFO forged") == "cpu\\n2026 INFO forged"
    assert safe_text("x" * 500, 20).startswith("x" * 20 + "... (500")


def _raise_own_open_file_limit(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, max(hard, n)))      # root may raise the hard limit


@pytest.mark.timeout(240)
def test_a_flood_of_idle_connections_does_not_lock_sites_out(tmp_path):
    """Finding 7: with the PS at a common open-file limit (1024), 1,100 idle TCP connections (no
    TLS, no secret needed) from one address locked every real site out until the handshake timeout
    cleared them. Now the PS shuts the oldest connections an address holds beyond
    limits.max_unauthenticated_per_peer that never carried an authenticated call, and says so: a
    real site from another address joins within 5 s while the flood goes on (the handshake
    timeout is the default 10 s, so that is not what freed the PS)."""
    _raise_own_open_file_limit(4096)
    cfg = small_config(num_sites=1, sites=["real"], **{"train.rounds": 2, "train.inner_steps": 4})
    (tmp_path / "c.json").write_text(cfg.to_json())
    port = free_port()
    ps = Proc(*ps_args(tmp_path / "c.json", port=port, run_dir=tmp_path / "run"),
              log=tmp_path / "ps.log", open_files=1024)
    flood: list[socket.socket] = []
    site = None
    try:
        ps.wait_for("listening on")
        assert "open-file limit 1024" in ps.text()
        for _ in range(1100):                   # from another loopback address, as another host would
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            flood.append(s)
        ps.wait_for("127.0.0.2 held", timeout=30)
        t0 = time.monotonic()
        site = HandSite(f"127.0.0.1:{port}", None, "real", "")
        site.enter()
        joined_s = time.monotonic() - t0
        assert joined_s < 5, f"the real site took {joined_s:.1f} s to join"
    finally:
        for s in flood:
            s.close()
        if site is not None:
            site.ch.close()
        ps.kill()
    line = next(x for x in ps.text().splitlines() if "127.0.0.2 held" in x)
    assert "never carried an authenticated call" in line and "max_unauthenticated_per_peer 64" in line


def test_the_guard_sheds_the_oldest_unauthenticated_connections_of_an_address():
    """ConnectionGuard on sockets this process accepted: a peer address over its cap loses its
    oldest never-authenticated connections, never an authenticated one, never another address's."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    clients, accepted = [], []
    try:
        reports: list[dict] = []
        guard = ConnectionGuard(Limits(max_unauthenticated_per_peer=3), lambda **f: reports.append(f))
        guard.port = port

        def connect(host: str) -> tuple[socket.socket, socket.socket]:
            c = socket.socket()
            c.bind((host, 0))
            c.connect(("127.0.0.1", port))
            a, _ = listener.accept()
            clients.append(c)
            accepted.append(a)
            return c, a

        old = [connect("127.0.0.2") for _ in range(4)]
        assert guard.sweep(now=0.0) == 1                       # 4 > 3: the oldest of them goes
        old[0][1].close()                                      # as gRPC closes it on the EOF
        site_c, _ = connect("127.0.0.3")
        guard.passed(f"ipv4:127.0.0.2:{old[0][0].getsockname()[1]}")   # too late: already shed
        guard.passed(f"ipv4:127.0.0.2:{old[1][0].getsockname()[1]}")   # authenticated: kept
        new = [connect("127.0.0.2") for _ in range(3)]
        assert guard.sweep(now=1.0) == 2                       # 5 unauthenticated: the 2 oldest go
        for c, _ in old + new + [(site_c, None)]:
            c.setblocking(False)

        def closed(c: socket.socket) -> bool:
            try:
                return c.recv(1) == b""
            except BlockingIOError:
                return False
        assert [closed(c) for c, _ in old] == [True, False, True, True]
        assert [closed(c) for c, _ in new] == [False, False, False] and not closed(site_c)
        assert guard.total_shed == 3 and peer_address("ipv6:[::ffff:127.0.0.2]:80") == ("127.0.0.2", 80)
        # Reported at once, then what came since every LOG_EVERY_S for as long as it goes on.
        assert reports == [{"peer": "127.0.0.2", "connections": 4, "shed": 1, "cap": 3}]
        guard.sweep(now=10.5)            # the 2 shed at 1.0 s (and what this sweep sheds) come out now
        assert len(reports) == 2 and reports[1]["connections"] == 5 and reports[1]["shed"] >= 2
        assert peer_address("unix:/tmp/x") is None
    finally:
        for s in clients + accepted + [listener]:
            s.close()
