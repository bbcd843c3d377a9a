"""TLS: the development CA helper, mutual TLS, and clear errors for bad certificate files."""

import grpc
from concurrent.futures import ThreadPoolExecutor

import pytest

from wantrain.transport.messages import Welcome
from wantrain.transport.tls import make_dev_certs
from wantrain.launch.argv import ps_args, site_args

from .helpers import Proc, free_port, small_config, wantrain
from .test_hostile import HandSite


@pytest.fixture(scope="module")
def mutual(tmp_path_factory):
    """A PS that requires client certificates from its development CA."""
    tmp = tmp_path_factory.mktemp("mtls")
    certs = make_dev_certs(tmp / "tls", clients=("a",))
    (tmp / "c.json").write_text(small_config(num_sites=1).to_json())
    port = free_port()
    ps = Proc(*ps_args(tmp / "c.json", port=port, run_dir=tmp / "run"),
              "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
              "--tls-client-ca", str(certs.ca), log=tmp / "ps.log")
    try:
        ps.wait_for("client certificates required")
        yield f"127.0.0.1:{port}", certs, ps
    finally:
        ps.kill()


@pytest.mark.timeout(90)
def test_mutual_tls_admits_only_sites_with_a_client_certificate(mutual, tmp_path):
    address, certs, ps = mutual
    assert certs.server_key.stat().st_mode & 0o777 == 0o600
    anonymous = HandSite(address, certs.client().credentials(), "a", "")
    assert anonymous.status().code() == grpc.StatusCode.UNAVAILABLE
    anonymous.close()
    other_ca = make_dev_certs(tmp_path / "other", clients=("a",))      # a certificate from another CA
    forged = HandSite(address, grpc.ssl_channel_credentials(
        certs.ca.read_bytes(), other_ca.clients["a"][1].read_bytes(), other_ca.clients["a"][0].read_bytes()),
        "a", "")
    assert forged.status().code() == grpc.StatusCode.UNAVAILABLE
    forged.close()
    good = HandSite(address, certs.client("a").credentials(), "a", "")
    assert isinstance(good.recv(), Welcome)
    good.close()
    assert ps.p.poll() is None


@pytest.mark.timeout(60)
def test_tls_dev_cli_and_bad_files(tmp_path):
    r = wantrain("tls-dev", str(tmp_path / "certs"), "--client", "site-1")
    assert r.returncode == 0, r.stderr
    assert "--tls-client-ca" in r.stdout and (tmp_path / "certs" / "client-site-1.pem").exists()
    (tmp_path / "junk.pem").write_text("not a certificate")
    r = wantrain("ps", "--port", "0", "--tls-cert", str(tmp_path / "junk.pem"), "--tls-key", str(tmp_path / "junk.pem"),
                 "--run-dir", str(tmp_path / "run"))
    assert r.returncode == 2 and "junk.pem is not PEM" in r.stderr, r.stderr
    r = wantrain(*site_args("127.0.0.1:1", "x", threads=0), "--tls-ca", str(tmp_path / "nope.pem"))
    assert r.returncode == 2 and "nope.pem does not exist" in r.stderr, r.stderr


@pytest.mark.timeout(120)
def test_a_site_says_why_tls_fails(mutual, tmp_path):
    """Finding 10: a TLS or CA mismatch was reported as 'not reachable ... giving up', the real cause
    only in gRPC's own log lines. The site now looks for itself and says it."""
    address, certs, ps = mutual
    other = make_dev_certs(tmp_path / "other")
    base = (*site_args(address, "a", threads=0), "--connect-timeout", "2")
    cases = [((), "the PS speaks TLS on this port: pass --tls-ca"),
             (("--tls-ca", str(other.ca)), "the PS's certificate is not trusted"),
             (("--tls-ca", str(certs.ca)), "the PS requires a client certificate"),
             (("--tls-ca", str(certs.ca), "--tls-server-name", "elsewhere"), "'elsewhere'")]
    with ThreadPoolExecutor(len(cases)) as pool:             # four sites at once: none ever joins
        results = list(pool.map(lambda case: wantrain(*base, *case[0], timeout=90), cases))
    for (_, cause), r in zip(cases, results):
        # The CLI's one-line error (gRPC's C core may log after it, from its own threads).
        last = next((ln for ln in reversed(r.stderr.splitlines()) if ln.startswith("wantrain worker:")), "")
        assert r.returncode == 1 and "giving up" in last and cause in last, r.stderr[-2000:]
        assert "Traceback" not in r.stderr
    assert ps.p.poll() is None
