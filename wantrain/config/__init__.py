"""Run configuration: frozen dataclasses with units in their names, JSON round-trip.

The parameter server owns the RunConfig and hands it to every site in its Welcome, so a site
needs nothing but the PS address and its own name. Every value is checked when the config is
built; an error names the field (`train.inner_steps must be >= 1, got 0`).

The sections, one per owner of what they set (sections.py): `model`, `data`, `train` (the DiLoCo
loop), `schedule` (when rounds start and close, when sites compute), `recovery` (what a round does
about what does not arrive, and how a site protects what it sends), `codec`, `robust`. A choice
out of a fixed set is a typed policy (policies.py), parsed here once. Keys that moved in 0.9 (the
`train` section held schedule and recovery) still load: each old key logs one warning naming its
new key (`RENAMED`); a config with both the old and the new key is refused.
"""

from __future__ import annotations

import dataclasses
import json
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .policies import (Aggregation, BudgetMode, CheckMode, Importance, LatePolicy, NormAction, Policy, ScheduleMode,
                       Trust)
from .sections import (CODEC_MODES, MAX_LANES, POLICIES, CodecConfig, DataConfig, ModelConfig, RecoveryConfig, RobustConfig,
                       ScheduleConfig, TrainConfig, _check, parse_policy)

__all__ = ["ModelConfig", "DataConfig", "TrainConfig", "ScheduleConfig", "RecoveryConfig", "CodecConfig",
           "RobustConfig", "RunConfig", "RenamedKeyWarning", "RENAMED", "CODEC_MODES", "MAX_LANES",
           "check_site_name", "Policy", "LatePolicy", "ScheduleMode", "BudgetMode", "Importance", "Trust",
           "NormAction", "Aggregation", "CheckMode", "parse_policy", "settings_from_text"]

# Keys that moved out of `train` when it was split by owner: old dotted key -> new one.
RENAMED = {
    "train.schedule": "schedule.mode",
    "train.controller": "schedule.controller",
    **{f"train.{k}": f"schedule.{k}" for k in ("deadline_s", "deadline_factor", "deadline_min_s",
                                                "deadline_initial_s", "quorum_share", "grace_factor",
                                                "quorum_wait_s")},
    **{f"train.{k}": f"recovery.{k}" for k in ("late_policy", "staleness_discount", "partial_deltas",
                                                "reliable_rounds", "loss_budget", "extend_above", "probe_every",
                                                "importance", "critical_copies", "parity_share",
                                                "parity_group_size", "protection_adapts", "lanes", "hedge_s",
                                                "hedge_all", "downlink_budget")},
}


class RenamedKeyWarning(FutureWarning):
    """A config key that moved still loads, once per load, with this warning naming its new key."""


def _renamed(key: str) -> str:
    new = RENAMED.get(key)
    if new is None:
        return key
    warnings.warn(f"config key {key} is now {new}; the old key still loads, and will be refused in a later version",
                  RenamedKeyWarning, stacklevel=4)
    return new


def _migrate(d: Any) -> Any:
    """A config dict with every old key moved to its new place (a warning each); both refused."""
    if not isinstance(d, dict) or not isinstance(d.get("train"), dict):
        return d
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
    for name in [n for n in d["train"] if f"train.{n}" in RENAMED]:
        section, new = _renamed(f"train.{name}").split(".")
        target = d.setdefault(section, {})
        if not isinstance(target, dict):
            raise ConfigError(f"{section} must be an object, got {target!r}")
        if new in target:
            raise ConfigError(f"config has both train.{name} and {section}.{new} (the old key and the new one): "
                              f"keep {section}.{new}")
        target[new] = d["train"].pop(name)
    return d


SITE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,63}")


def check_site_name(name: object) -> str | None:
    """None if `name` may name a site, else why not (the wire and the run config share the rule:
    names reach file names, log lines and every watcher)."""
    if not isinstance(name, str) or not SITE_NAME.fullmatch(name):
        shown = repr(name if not isinstance(name, str) or len(name) <= 80 else name[:80] + "...")
        return f"site names are 1-64 letters, digits and ._:@+- starting with a letter or digit, got {shown}"
    return None


@dataclass(frozen=True)
class RunConfig:
    """Everything the PS needs to run, and every site needs to join."""

    num_sites: int = 3
    sites: tuple[str, ...] = ()       # optional: the sites' names; site i trains on data shard i
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    codec: CodecConfig = field(default_factory=CodecConfig)
    robust: RobustConfig = field(default_factory=RobustConfig)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        _check(1 <= self.num_sites <= 1024, "num_sites", "must be in [1, 1024]", self.num_sites)
        _check(not self.sites or (len(self.sites) == self.num_sites and len(set(self.sites)) == len(self.sites)),
               "sites", f"must be empty or {self.num_sites} distinct names", self.sites)
        for name in self.sites:
            why = check_site_name(name)
            if why:
                raise ConfigError(f"sites: {why}")
        self.model.validate()
        self.data.validate()
        for section in (self.model, self.data, self.train, self.schedule, self.recovery, self.codec, self.robust):
            section.validate()
        # The rules that join two sections.
        t, s, r = self.train, self.schedule, self.recovery
        _check(t.fragments == 1 or s.mode is ScheduleMode.SYNC, "train.fragments",
               "fragments need schedule.mode 'sync' (overlap moves the whole model's steps ahead)", t.fragments)
        _check(t.fragments == 1 or not r.late_policy.discounts_late, "recovery.late_policy",
               "'stale' counts a late delta in a later round's mean, which under train.fragments moves another "
               "fragment: use 'zero-outside' (a late delta applied outside the momentum), 'zero-carry', 'drop' "
               "or 'rescale'", str(r.late_policy))
        _check(not s.controller.adapts or t.round_budget_s > 0, "schedule.controller",
               "'adaptive' sets each site's compute budget: it needs train.round_budget_s > 0", str(s.controller))
        _check(s.deadline_s == 0 or s.deadline_s > t.round_budget_s, "schedule.deadline_s",
               f"must exceed train.round_budget_s ({t.round_budget_s}) or be 0 (derived)", s.deadline_s)

    @property
    def patches_downlink(self) -> bool:
        """Does the PS send part of an update after the next RoundStart (on an unsharded PS, after the
        warm-up)? recovery.downlink_budget, under the sync schedule: steps taken ahead (overlap) are
        moved onto the whole update, never onto part of it."""
        return self.recovery.downlink_budget > 0 and self.schedule.mode is ScheduleMode.SYNC

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunConfig:
        return _build(cls, _migrate(d), "")

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"config is not valid JSON: {e}") from None
        return cls.from_dict(d)

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {p} does not exist")
        return cls.from_json(p.read_text())

    def replace(self, **changes: Any) -> RunConfig:
        """A copy with top-level or dotted fields changed: replace(**{"train.rounds": 3})."""
        d = self.to_dict()
        for key, value in changes.items():
            key = _renamed(key)
            target = d
            *path, last = key.split(".")
            for part in path:
                if part not in target or not isinstance(target[part], dict):
                    raise ConfigError(f"unknown config field {key!r}")
                target = target[part]
            if last not in target:
                raise ConfigError(f"unknown config field {key!r}")
            target[last] = value
        return RunConfig.from_dict(d)


def _build(cls: type, d: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "config"
    if not isinstance(d, dict):
        raise ConfigError(f"{where} must be an object, got {d!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config field {prefix + unknown[0]!r} (known: {', '.join(sorted(fields))})")
    kwargs = {}
    for name, value in d.items():
        f = fields[name]
        sub = _SECTIONS.get(name) if cls is RunConfig else None
        if sub is not None:
            kwargs[name] = _build(sub, value, f"{prefix}{name}.")
        else:
            kwargs[name] = _coerce(f, value, f"{prefix}{name}")
    if cls is RunConfig:
        return cls(**kwargs)
    obj = cls(**kwargs)
    return obj


def _coerce(f: dataclasses.Field, value: Any, name: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
    elif kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name} must be a number, got {value!r}")
        value = float(value)
    elif kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
    elif kind == "str":
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got {value!r}")
    elif kind in POLICIES:
        value = parse_policy(POLICIES[kind], value, name)
    elif kind.startswith("tuple"):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name} must be a list, got {value!r}")
        value = tuple(value)
    return value


_SECTIONS = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig, "schedule": ScheduleConfig,
             "recovery": RecoveryConfig, "codec": CodecConfig, "robust": RobustConfig}


def settings_from_text(items: list[str], where: str = "") -> dict[str, Any]:
    """`KEY=VALUE` items (a command line's, a bench's spec) as changes for `RunConfig.replace`:
    VALUE as JSON where it parses (4, 0.5, true, "text"), else as the text it is (drop). An item
    without "=" is a ConfigError (prefixed by `where`); replace() names a wrong key or value."""
    changes: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{where}{item!r}: expected KEY=VALUE, e.g. train.batch_size=4")
        try:
            changes[key.strip()] = json.loads(text)
        except ValueError:
            changes[key.strip()] = text
    return changes
