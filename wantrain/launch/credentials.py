"""The secrets of one run, made fresh in its folder when it starts.

Even on one machine the PS admits only this run's sites and shows its telemetry only to this
run's observers: a shared secret all sites present (a token per site for a PS on another host,
which then knows each site by it), an observer token, and with TLS a development CA whose
certificate the sites verify the PS by. Each is a 0600 file, never a command line argument.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..transport.auth import new_secret_file, read_secret

if TYPE_CHECKING:
    from ..transport.tls import DevCerts

__all__ = ["Credentials"]


class Credentials:
    """A run's secret files, by the role each plays for the PS (`files`)."""

    def __init__(self, run_dir: Path, sites: list[str], token_per_site: bool,
                 tls_hosts: tuple[str, ...] | None) -> None:
        self.files: dict[str, Path] = {}
        if token_per_site:
            self.site_tokens = {s: new_secret_file(run_dir / f"token-{s}") for s in sites}
            tokens = run_dir / "tokens.json"
            tokens.touch(mode=0o600)
            tokens.write_text(json.dumps({s: read_secret(f) for s, f in self.site_tokens.items()}))
            self.files["tokens"] = tokens
        else:
            self.site_tokens = dict.fromkeys(sites, new_secret_file(run_dir / "secret"))
            self.files["shared-secret"] = self.site_tokens[sites[0]]
        self.files["observer-token"] = new_secret_file(run_dir / "observer-token")
        self.observer_token = read_secret(self.files["observer-token"])
        self.certs: DevCerts | None = None
        if tls_hosts is not None:
            from ..transport.tls import make_dev_certs  # cryptography: only for runs that use TLS
            self.certs = make_dev_certs(run_dir / "tls", hosts=tls_hosts)
            self.files.update({"tls-cert": self.certs.server_cert, "tls-key": self.certs.server_key})

    def client(self):
        """The TLS credentials this process uses to reach the PS (None without TLS)."""
        return self.certs.client() if self.certs is not None else None
