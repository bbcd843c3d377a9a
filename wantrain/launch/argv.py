"""The command lines of a run's processes, built in one place: `Run`, the tests and the benches use these."""

from __future__ import annotations

from pathlib import Path

from .plan import SitePlan

__all__ = ["ps_args", "ps_command", "site_args", "site_command", "links_command", "options"]


def options(**given) -> tuple[str, ...]:
    """Command line options from keyword arguments: `run_dir="x"` is `--run-dir x`, `True` the flag
    alone, a list or tuple the option once per item; None and False are left out."""
    out: tuple[str, ...] = ()
    for key, value in given.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out += (flag,)
        elif isinstance(value, (list, tuple)):
            out += tuple(x for v in value for x in (flag, str(v)))
        else:
            out += (flag, str(value))
    return out


def ps_args(config: str | Path | None = None, *, port: int = 0, run_dir: str | Path | None = None, **more) -> tuple[str, ...]:
    """`wantrain ps` arguments: its config file, the port (0: a free one, see `port_file`), its run
    folder, and any other option of `wantrain ps --help` by name (`shared_secret_file=path`, `stall=[...]`)."""
    return ("ps", *options(config=config, port=port, run_dir=run_dir, **more))


def ps_command(python: str, config: str | Path | None = None, **kw) -> tuple[str, ...]:
    """The whole `wantrain ps` command, run by `python`."""
    return (python, "-m", "wantrain", *ps_args(config, **kw))


def site_args(ps: str, name: str, *, threads: int = 1, device: str = "auto", token_file: str | Path | None = None,
              link: SitePlan | None = None, tls_ca: str | Path | None = None, tls_server_name: str = "",
              nproc: int = 1, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """`wantrain worker` arguments for site `name`. With its `link` (from the run plan, once the
    link listens) it dials through the link and knows the link's RTT, bandwidth and its speed factor."""
    args: tuple[str, ...] = ("worker", "--ps", (link.dial if link is not None and link.dial else ps), "--site", name,
                             "--threads", str(threads), "--device", device)
    if nproc > 1:               # a torch.distributed group of processes (site/group.py)
        args += ("--nproc", str(nproc))
    if token_file is not None:
        args += ("--token-file", str(token_file))
    if link is not None:
        args += ("--speed-factor", repr(link.speed_factor), "--link-rtt-ms", repr(link.rtt_ms),
                 "--link-mbps", repr(link.bandwidth_mbps or 0.0))
        if link.chunk_loss > 0:
            args += ("--chunk-loss", repr(link.chunk_loss), "--chunk-burst", repr(link.chunk_burst),
                     "--chunk-late-s", repr(link.chunk_late_s))
    if tls_ca is not None:
        args += ("--tls-ca", str(tls_ca)) + (("--tls-server-name", tls_server_name) if tls_server_name else ())
    return args + tuple(extra)


def site_command(python: str, ps: str, name: str, link: SitePlan | None = None, **kw) -> tuple[str, ...]:
    """The whole command: under the link's prefix (a network namespace) when it has one."""
    prefix = link.exec_prefix if link is not None else ()
    return (*prefix, python, "-m", "wantrain", *site_args(ps, name, link=link, **kw))


def links_command(python: str, plan_file: str | Path, target: str, listening: str | Path, log: str | Path,
                  control: str | Path) -> tuple[str, ...]:
    """The link emulator of a run plan (`python -m testbed links`), relaying to the PS at `target`."""
    return (python, "-m", "testbed", "links", "--plan", str(plan_file), "--target", target,
            "--listening", str(listening), "--log", str(log), "--control", str(control))
