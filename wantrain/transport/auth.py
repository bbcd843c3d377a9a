"""Who may join a run, and who may watch it: per-site tokens or one shared secret, and an observer token.

Sites present their secret in the Join. Watch (the run's telemetry: config, sites, losses, hashes,
errors), Report (events into the run's log: faults, link outages) and Ping need one too, as gRPC
metadata `authorization: Bearer <token>`. Watch and Report are an operator's: they take the
observer token (a notebook, the CLI, the link emulator), and a site's credential only where the
run grants it (`sites_observe`): sites of different institutions would otherwise read each other's
telemetry and write events into the run's log. Ping takes a site's own secret or the observer
token. A PS with no secret at all is open to everyone (development on one machine).

Secrets never travel in the run config (which every site receives) and never sit on a command
line: the PS reads them from files (`--tokens FILE`: a JSON object site -> token;
`--shared-secret-file FILE`, `--observer-token-file FILE`), a site from `--token-file FILE`, an
observer from `--observer-token-file FILE`. Comparisons take constant time.
"""

from __future__ import annotations

import hmac
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError

__all__ = ["Authenticator", "read_secret", "new_secret_file", "bearer", "token_from_metadata", "METADATA_KEY"]

METADATA_KEY = "authorization"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """gRPC call metadata that presents `token` (Watch, Ping)."""
    return ((METADATA_KEY, f"Bearer {token}"),) if token else ()


def read_secret(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"secret file {p} does not exist")
    text = p.read_text().strip()
    if not text:
        raise ConfigError(f"secret file {p} is empty")
    return text


def new_secret_file(path: str | Path) -> Path:
    """Write a fresh random secret readable by its owner only."""
    p = Path(path)
    p.touch(mode=0o600, exist_ok=True)
    p.chmod(0o600)
    p.write_text(secrets.token_urlsafe(32) + "\n")
    return p


@dataclass(frozen=True)
class Authenticator:
    tokens: dict[str, str] = field(default_factory=dict, repr=False)   # site -> token
    shared_secret: str = field(default="", repr=False)
    observer_token: str = field(default="", repr=False)
    sites_observe: bool = False      # a site's credential may also Watch and Report

    @property
    def open(self) -> bool:
        return not self.tokens and not self.shared_secret and not self.observer_token

    @classmethod
    def from_files(cls, tokens_file: str | Path | None = None, shared_secret_file: str | Path | None = None,
                   observer_token_file: str | Path | None = None, sites_observe: bool = False):
        tokens: dict[str, str] = {}
        if tokens_file:
            p = Path(tokens_file)
            try:
                tokens = json.loads(read_secret(p))
            except json.JSONDecodeError as e:
                raise ConfigError(f"tokens file {p} is not JSON: {e}") from None
            if not isinstance(tokens, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                                        for k, v in tokens.items()):
                raise ConfigError(f"tokens file {p} must be a JSON object of site name -> non-empty token")
        return cls(tokens, read_secret(shared_secret_file) if shared_secret_file else "",
                   read_secret(observer_token_file) if observer_token_file else "", sites_observe)

    def check(self, site: str, token: str) -> str | None:
        """None if the site may join, else the reason (for the log; the site hears less)."""
        if not self.tokens and not self.shared_secret:
            return None
        given = token.encode()
        if site in self.tokens and hmac.compare_digest(given, self.tokens[site].encode()):
            return None
        if self.shared_secret and hmac.compare_digest(given, self.shared_secret.encode()):
            return None
        return "unknown site" if self.tokens and site not in self.tokens and not self.shared_secret else "bad token"

    def may_watch(self, token: str) -> bool:
        """Watch and Report: the observer token, or a site's secret where the run grants it (anyone, if
        the PS has no secret)."""
        if self.open:
            return True
        given = token.encode()
        if self.observer_token and hmac.compare_digest(given, self.observer_token.encode()):
            return True
        return self.sites_observe and bool(token) and any(
            hmac.compare_digest(given, secret.encode()) for secret in (self.shared_secret, *self.tokens.values()))

    def may_ping(self, site: str, token: str) -> bool:
        """Ping: what may join (a site's own secret) or watch."""
        return self.may_watch(token) or self.check(site, token) is None


def token_from_metadata(metadata) -> str:
    """The bearer token of a call's metadata ("" if none)."""
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str) and value.startswith("Bearer "):
            return value[len("Bearer "):]
    return ""
