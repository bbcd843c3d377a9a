"""Finding 8: Watch and Ping need a token, as Join does.

The run's telemetry names its sites and devices and carries its config, losses, hashes and
error messages: only an observer (the observer token) may read it, and only an observer may
write events into the run's log (Report); a site's credential does neither unless the run grants
it. `Run` (the notebook, `wantrain demo`) and `wantrain watch` pass the token.
"""

import json

import grpc
import pytest

from wantrain.transport import net
from wantrain.transport.auth import bearer
from wantrain.transport.proto.v1 import ps_pb2 as pb
from wantrain.launch.argv import ps_args

from .helpers import Proc, free_port, small_config, wantrain

SECRET = "shared-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def ps(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("watch")
    (tmp / "c.json").write_text(small_config(num_sites=2, sites=["a", "b"]).to_json())
    (tmp / "secret").write_text(SECRET)
    port = free_port()
    proc = Proc(*ps_args(tmp / "c.json", port=port, run_dir=tmp / "run"),
                "--shared-secret-file", str(tmp / "secret"), log=tmp / "ps.log")
    proc.wait_for("listening on")
    yield f"127.0.0.1:{port}", proc, tmp
    proc.kill()


def first_event(address: str, metadata=(), raw: bytes | None = None):
    with net.channel(address) as ch:
        if raw is not None:
            watch = ch.unary_stream("/wantrain.v1.ParameterServer/Watch", request_serializer=lambda b: b,
                                    response_deserializer=pb.TelemetryEvent.FromString)
            stream = watch(raw, metadata=metadata, timeout=20)
        else:
            stream = net.stub(ch).Watch(pb.WatchRequest(), metadata=metadata, timeout=20)
        try:
            return json.loads(next(stream).json)
        finally:
            stream.cancel()


def ping(address: str, site: str, metadata=()):
    with net.channel(address) as ch:
        return net.stub(ch).Ping(pb.PingRequest(site=site), metadata=metadata, timeout=20)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("metadata", [(), bearer("wrong"), (("authorization", SECRET),), bearer(SECRET)])
def test_watch_without_the_observer_token_is_refused(ps, metadata):
    address, proc, _ = ps
    with pytest.raises(grpc.RpcError) as info:
        first_event(address, metadata)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and "observer token" in info.value.details()
    assert proc.p.poll() is None


@pytest.mark.timeout(60)
def test_observers_with_a_token_see_the_run(ps):
    address, _, tmp = ps
    observer = (tmp / "run" / "observer-token").read_text().strip()      # made by the PS, 0600
    assert (tmp / "run" / "observer-token").stat().st_mode & 0o077 == 0
    assert first_event(address, bearer(observer))["kind"] == "run_start"


@pytest.mark.timeout(60)
def test_only_an_observer_writes_into_the_runs_log(ps):
    address, proc, tmp = ps
    fault = pb.ReportRequest(events=[json.dumps({"kind": "fault", "action": "kill site", "site": "a"})])
    with net.channel(address) as ch:
        for metadata in ((), bearer(SECRET)):        # a site's credential is not an operator's
            with pytest.raises(grpc.RpcError) as info:
                net.stub(ch).Report(fault, metadata=metadata, timeout=20)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED and "observer token" in info.value.details()
        observer = (tmp / "run" / "observer-token").read_text().strip()
        net.stub(ch).Report(fault, metadata=bearer(observer), timeout=20)
    faults = [e for e in (json.loads(ln) for ln in (tmp / "run" / "events.jsonl").read_text().splitlines())
              if e["kind"] == "fault"]
    assert len(faults) == 1 and faults[0]["source"] == "reported"
    assert proc.p.poll() is None


@pytest.mark.timeout(60)
def test_a_watch_request_protobuf_cannot_parse_is_invalid(ps):
    address, _, tmp = ps
    observer = (tmp / "run" / "observer-token").read_text().strip()
    with pytest.raises(grpc.RpcError) as info:
        first_event(address, bearer(observer), raw=b"\xff\xff\xff")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.timeout(60)
def test_ping_needs_a_site_or_observer_token(ps):
    address, _, _ = ps
    with pytest.raises(grpc.RpcError) as info:
        ping(address, "a")
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ping(address, "a", bearer(SECRET)).server_time > 0


@pytest.mark.timeout(120)
def test_wantrain_watch_passes_the_token(ps):
    address, _, tmp = ps
    refused = wantrain("watch", "--ps", address, "--timeout", "10")
    assert refused.returncode == 1 and "refused to show its telemetry" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    seen = wantrain("watch", "--ps", address, "--observer-token-file", str(tmp / "run" / "observer-token"),
                    "--timeout", "5")
    assert seen.returncode == 0, seen.stderr
    assert json.loads(seen.stdout.splitlines()[0])["kind"] == "run_start"
