"""Only the run's sites get in: per-site tokens or a shared secret, checked on Join."""

import json
import stat

import grpc
import pytest

from wantrain.transport import net
from wantrain.transport.auth import Authenticator, new_secret_file
from wantrain.errors import ConfigError
from wantrain.transport.messages import PROTOCOL_VERSION
from wantrain.transport.proto.v1 import ps_pb2 as pb
from wantrain.launch.argv import ps_args, site_args

from .helpers import Proc, free_port, small_config
from .test_bad_input import raw_join


def test_authenticator_rules(tmp_path):
    assert Authenticator().check("anyone", "") is None
    a = Authenticator(tokens={"a": "t-a"})
    assert a.check("a", "t-a") is None and a.check("a", "t-b") == "bad token" and a.check("z", "t-a") == "unknown site"
    s = Authenticator(shared_secret="s")
    assert s.check("anyone", "s") is None and s.check("anyone", "") == "bad token"
    # Watch and Report: the observer token; a site's credential only where the run grants it.
    for sites_observe in (False, True):
        o = Authenticator(tokens={"a": "t-a"}, shared_secret="s", observer_token="o", sites_observe=sites_observe)
        assert o.may_watch("o") and not o.may_watch("") and not o.may_watch("x")
        assert o.may_watch("s") is sites_observe and o.may_watch("t-a") is sites_observe
    assert Authenticator().may_watch("") and not Authenticator(shared_secret="s", sites_observe=True).may_watch("")
    f = new_secret_file(tmp_path / "secret")
    assert stat.S_IMODE(f.stat().st_mode) == 0o600 and len(f.read_text().strip()) >= 32
    (tmp_path / "bad.json").write_text('["a"]')
    with pytest.raises(ConfigError, match="site name -> non-empty token"):
        Authenticator.from_files(tokens_file=tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="does not exist"):
        Authenticator.from_files(shared_secret_file=tmp_path / "nope")


@pytest.mark.timeout(120)
def test_unknown_site_and_bad_token_are_unauthenticated(tmp_path):
    (tmp_path / "c.json").write_text(small_config(num_sites=2).to_json())
    (tmp_path / "tokens.json").write_text(json.dumps({"a": "token-of-a", "b": "token-of-b"}))
    port = free_port()
    ps = Proc(*ps_args(tmp_path / "c.json", port=port, run_dir=tmp_path / "run"),
              "--tokens", str(tmp_path / "tokens.json"), log=tmp_path / "ps.log")
    try:
        ps.wait_for("listening on")
        address = f"127.0.0.1:{port}"
        for site, token in (("a", "wrong"), ("mallory", "token-of-a"), ("b", "")):
            got, err = raw_join(address, site=site, protocol_version=PROTOCOL_VERSION, token=token)
            assert err is not None and err.code() == grpc.StatusCode.UNAUTHENTICATED, (site, err)
            assert "not allowed to join" in err.details() and "token-of" not in err.details()
        # A connection carries 16 calls at once: more refused Sessions than that on one connection
        # leave it serving a valid one (they held it, REFUSED_STREAM on every call, for 20 s).
        with net.channel(address) as ch:
            stub = net.stub(ch)
            join = lambda token: iter([pb.SiteMessage(join=pb.Join(site="a", protocol_version=PROTOCOL_VERSION,
                                                                   token=token))])
            for _ in range(2 * net.MAX_STREAMS_PER_CONNECTION):
                with pytest.raises(grpc.RpcError) as info:
                    list(stub.Session(join("wrong"), timeout=20))
                assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            welcome = next(stub.Session(join("token-of-a"), timeout=20))
            assert welcome.WhichOneof("body") == "welcome"
        (tmp_path / "wrong").write_text("nope\n")
        w = Proc(*site_args(address, "b", threads=0), "--token-file", str(tmp_path / "wrong"),
                 log=tmp_path / "w.log")
        try:
            assert w.p.wait(60) == 1 and "not allowed to join" in w.text() and "Traceback" not in w.text()
        finally:
            w.kill()
        assert ps.p.poll() is None
    finally:
        ps.kill()
