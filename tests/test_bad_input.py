"""Bad input gets one clear message that names the problem, and leaves no process behind."""

import json
import time

import grpc
import pytest

from wantrain.transport import net, wire
from wantrain.transport.messages import PROTOCOL_VERSION
from wantrain.transport.proto.v1 import ps_pb2 as pb
from wantrain.launch.argv import ps_args, site_args

from .helpers import Proc, free_port, pid_alive, small_config, wantrain


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, needle", [
    (["demo", "--preset", "gpt9"], "model.preset must be one of"),
    (["demo", "--corpus", "/no/such/corpus"], "corpus path '/no/such/corpus' does not exist"),
    (["demo", "--rounds", "0"], "train.rounds must be >= 1"),
    (["demo", "--set", "train.batchsize=4"], "unknown config field 'train.batchsize'"),
])
def test_cli_names_the_problem(args, needle, tmp_path):
    r = wantrain(*args, "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr


@pytest.mark.timeout(60)
def test_bad_config_file_names_the_field(tmp_path):
    cfg = small_config().to_dict()
    cfg["codec"]["quant_block"] = -4
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    r = wantrain(*ps_args(tmp_path / "c.json", port="0"))
    assert r.returncode == 2 and "codec.quant_block must be 1 to codec.chunk_bytes" in r.stderr, r.stderr


@pytest.mark.timeout(60)
def test_worker_retries_an_absent_ps_then_gives_up(tmp_path):
    r = wantrain(*site_args(f"127.0.0.1:{free_port()}", "lonely", threads=0), "--connect-timeout", "3")
    assert r.returncode == 1
    assert "not reachable" in r.stderr and "retrying in" in r.stderr
    assert "giving up" in r.stderr and "Traceback" not in r.stderr


@pytest.fixture
def ps(tmp_path):
    cfg = small_config(num_sites=2)
    (tmp_path / "c.json").write_text(cfg.to_json())
    port = free_port()
    proc = Proc(*ps_args(tmp_path / "c.json", port=port, run_dir=tmp_path / "run"),
                log=tmp_path / "ps.log")
    proc.wait_for("listening on")
    yield f"127.0.0.1:{port}", proc
    proc.kill()


def raw_join(address: str, **join) -> tuple[list, grpc.RpcError | None]:
    """Open a Session by hand and send one Join; returns what came back and the final status."""
    with net.channel(address) as ch:
        stub = net.stub(ch)
        got = []
        try:
            for m in stub.Session(iter([pb.SiteMessage(join=pb.Join(**join))]), timeout=20):
                got.append(wire.server_message_from_proto(m))
                if len(got) > 1:
                    break
        except grpc.RpcError as e:
            return got, e
        return got, None


@pytest.mark.timeout(120)
def test_protocol_version_mismatch(ps):
    address, proc = ps
    got, err = raw_join(address, site="old", protocol_version=PROTOCOL_VERSION + 1)
    assert err is not None and err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "wire protocol" in err.details() and got[0].code == "protocol_version"
    assert proc.p.poll() is None                      # the PS stays up


@pytest.mark.timeout(120)
def test_a_second_process_under_a_site_s_name_replaces_it_and_the_first_stops(ps, tmp_path):
    """Over real gRPC: a site restarted while the PS still holds its session takes its place at once;
    were two processes running under one name, the older is told it was replaced and stops."""
    address, proc = ps
    first = Proc(*site_args(address, "twin", threads=1), log=tmp_path / "w1.log")
    try:
        first.wait_for("model at round 0 loaded", timeout=60)
        second = Proc(*site_args(address, "twin", threads=1), log=tmp_path / "w2.log")
        try:
            assert first.p.wait(60) == 1
            assert "replaced" in first.text() and "another process runs under its name" in first.text()
            assert "Traceback" not in first.text()
            second.wait_for("model at round 0 loaded", timeout=60)
            assert second.p.poll() is None and proc.p.poll() is None
        finally:
            second.kill()
        got, err = raw_join(address, site="", protocol_version=PROTOCOL_VERSION)
        assert err is not None and err.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        first.kill()
    assert not pid_alive(first.p.pid)


@pytest.mark.timeout(60)
def test_garbage_on_the_port_does_not_kill_the_ps(ps):
    import socket
    address, proc = ps
    host, port = address.split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"\x00GARBAGE" * 1000)
        time.sleep(0.5)
    got, err = raw_join(address, site="x", protocol_version=PROTOCOL_VERSION)
    assert got and got[0].__class__.__name__ == "Welcome"
    assert proc.p.poll() is None


@pytest.mark.timeout(60)
def test_corrupt_chunk_after_join_gets_invalid_argument(ps):
    address, proc = ps
    chunk = pb.Chunk(kind=pb.CHUNK_KIND_DELTA, round=0, index=0, count=1, tensor="wte.weight", offset=0,
                          length=4, encoding=pb.ENCODING_FP32, payload=b"\x00" * 16, crc32=12345)
    msgs = [pb.SiteMessage(join=pb.Join(site="mallory", protocol_version=PROTOCOL_VERSION)),
            pb.SiteMessage(chunk=chunk)]
    with net.channel(address) as ch:
        stub = net.stub(ch)
        with pytest.raises(grpc.RpcError) as info:
            for _ in stub.Session(iter(msgs), timeout=20):
                pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "CRC" in info.value.details()
    assert proc.p.poll() is None
    proc.wait_for("site mallory left: rejected")


@pytest.mark.timeout(120)
def test_a_broken_scenario_is_bad_input(tmp_path):
    """Finding 10: broken scenarios exited 1 where the CLI promises 2 for bad input."""
    (tmp_path / "s.toml").write_text('name = "x"\nps_region = "East US"\n\n[[site]]\nname = "a"\nregion = "Atlantis"\n')
    r = wantrain("demo", "--scenario", str(tmp_path / "s.toml"), "--run-dir", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "s.toml:6: field site[0].region" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_version_names_the_package_the_wire_protocol_and_the_telemetry_schema(capsys):
    try:
        import tomllib
    except ImportError:                  # Python 3.10
        import tomli as tomllib
    from pathlib import Path

    from wantrain import __version__
    from wantrain.commands.cli import main
    from wantrain.transport.messages import PROTOCOL_VERSION

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    said = capsys.readouterr().out.strip()
    assert said == f"wantrain {__version__} (wire protocol {PROTOCOL_VERSION}, telemetry schema 2)"
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert project["version"] == __version__           # one version, said in two places


def test_every_option_of_every_command_has_a_help_line():
    import argparse

    from wantrain.commands.cli import build_parser

    def missing(parser: argparse.ArgumentParser, name: str) -> list[str]:
        out = []
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub_name, sub in a.choices.items():
                    out += missing(sub, f"{name} {sub_name}")
            elif not isinstance(a, argparse._HelpAction) and not (a.help and a.help.strip()):
                out.append(f"{name} {'/'.join(a.option_strings) or a.dest}")
        return out
    assert not missing(build_parser(), "wantrain")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args, needle", [
    (["host", "check", "ssh://no-such-host.invalid", "--no-host-key-check", "--connect-timeout", "5"],
     "ssh://{user}@no-such-host.invalid:22: cannot connect"),        # no user: this account's, as ssh does
    (["watch", "--ps", "127.0.0.1:{port}", "--connect-timeout", "2"], "nothing listens on 127.0.0.1:{port}"),
    (["watch", "--ps", "127.0.0.1:{port}", "--timeout", "2"], "no parameter server answered at 127.0.0.1:{port}"),
])
def test_cli_failures_are_one_line_and_an_error_exit(args, needle, tmp_path):
    import getpass

    port = free_port()
    fill = dict(user=getpass.getuser(), port=port)
    r = wantrain(*(a.format(**fill) for a in args), cwd=tmp_path, timeout=60)
    assert r.returncode != 0, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle.format(**fill) in lines[0] and "Traceback" not in r.stderr, r.stderr


def test_demo_sets_any_config_field_by_name():
    """`wantrain demo --set KEY=VALUE`: the value as JSON where it parses, else as text, applied after
    the demo's own flags; a value of the wrong type or an item without "=" is named."""
    from wantrain.commands.cli import build_parser
    from wantrain.commands.demo import demo_config
    from wantrain.errors import ConfigError

    def cfg(*items: str):
        return demo_config(build_parser().parse_args(["demo", "--rounds", "3", *[a for i in items for a in ("--set", i)]]))

    c = cfg("train.batch_size=4", "recovery.late_policy=drop", "schedule.quorum_wait_s=2.5", "train.rounds=5")
    assert (c.train.batch_size, c.recovery.late_policy, c.schedule.quorum_wait_s, c.train.rounds) == (4, "drop", 2.5, 5)
    with pytest.raises(ConfigError, match="train.batch_size must be an integer, got 'four'"):
        cfg("train.batch_size=four")
    with pytest.raises(ConfigError, match="--set 'rounds': expected KEY=VALUE"):
        cfg("rounds")
