import json

import pytest

from wantrain.config import RENAMED, LatePolicy, RecoveryConfig, RenamedKeyWarning, RunConfig, ScheduleMode
from wantrain.errors import ConfigError


def test_json_round_trip():
    cfg = RunConfig().replace(**{"train.rounds": 3, "codec.mode": "int8", "num_sites": 2})
    again = RunConfig.from_json(cfg.to_json())
    assert again == cfg and again.train.rounds == 3 and again.codec.mode == "int8"


@pytest.mark.parametrize("change, field", [
    ({"model.preset": "gpt5"}, "model.preset"),
    ({"train.inner_steps": 0}, "train.inner_steps"),
    ({"train.outer_momentum": 1.5}, "train.outer_momentum"),
    ({"codec.mode": "zip"}, "codec.mode"),
    ({"data.val_fraction": 0.9}, "data.val_fraction"),
    ({"num_sites": 0}, "num_sites"),
    ({"train.inner_lr": float("nan")}, "train.inner_lr"),
    ({"recovery.late_policy": "wait"}, "recovery.late_policy"),
    ({"recovery.loss_budget": 1.0}, "recovery.loss_budget"),
])
def test_bad_values_name_the_field(change, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        RunConfig().replace(**change)


def test_partial_deltas_count_only_under_a_policy_with_a_substitute():
    assert RunConfig().recovery.counts_partial                       # the default: zero-outside, partial deltas
    for policy in ("drop", "stale"):                              # a late delta whole or not at all
        assert not RunConfig().replace(**{"recovery.late_policy": policy}).recovery.counts_partial
    assert not RunConfig().replace(**{"recovery.partial_deltas": False}).recovery.counts_partial


def test_old_keys_load_with_one_warning_naming_the_new_key():
    old = {"train": {"rounds": 3, "late_policy": "drop", "schedule": "overlap", "lanes": 2, "deadline_s": 30.0}}
    with pytest.warns(RenamedKeyWarning) as caught:
        cfg = RunConfig.from_dict(old)
    assert sorted(str(w.message).split()[2] for w in caught) == sorted(
        ["train.late_policy", "train.schedule", "train.lanes", "train.deadline_s"])
    assert "recovery.late_policy" in " ".join(str(w.message) for w in caught)
    assert (cfg.train.rounds, cfg.recovery.late_policy, cfg.schedule.mode, cfg.recovery.lanes,
            cfg.schedule.deadline_s) == (3, LatePolicy.DROP, ScheduleMode.OVERLAP, 2, 30.0)
    with pytest.warns(RenamedKeyWarning, match="train.hedge_s is now recovery.hedge_s"):
        assert RunConfig().replace(**{"train.hedge_s": 0.5}).recovery.hedge_s == 0.5
    with pytest.raises(ConfigError, match="both train.lanes and recovery.lanes"), pytest.warns(RenamedKeyWarning):
        RunConfig.from_dict({"train": {"lanes": 2}, "recovery": {"lanes": 3}})
    # every old key has a field at its new place, and no old key is a field of train any more
    fields = RunConfig().to_dict()
    for key, new in RENAMED.items():
        section, name = new.split(".")
        assert name in fields[section] and key.split(".")[1] not in fields["train"], key


def test_a_policy_is_parsed_once_into_its_typed_value():
    cfg = RunConfig().replace(**{"recovery.late_policy": "rescale"})
    policy = cfg.recovery.late_policy
    assert policy is LatePolicy.RESCALE and str(policy) == "rescale" and f"{policy}" == "rescale"
    assert json.loads(cfg.to_json())["recovery"]["late_policy"] == "rescale"
    assert RunConfig.from_json(cfg.to_json()) == cfg
    assert RecoveryConfig(late_policy="zero-carry").late_policy is LatePolicy.ZERO_CARRY   # built in Python too
    with pytest.raises(ConfigError, match=r"recovery.late_policy must be one of .*'zero-outside'"):
        RecoveryConfig(late_policy="wait")
    # the behaviour each value selects, in one table
    rows = {p: (p.zero_substitute, p.applies_late, p.carries_unapplied, p.allows_partial, p.substitute)
            for p in LatePolicy}
    assert rows == {LatePolicy.DROP: (False, False, True, False, "peer"),
                    LatePolicy.STALE: (False, True, True, False, "peer"),
                    LatePolicy.RESCALE: (False, False, False, True, "peer"),
                    LatePolicy.ZERO_OUTSIDE: (True, True, True, True, "zero"),
                    LatePolicy.ZERO_CARRY: (True, False, True, True, "zero")}


def test_unknown_and_mistyped_fields_are_named():
    d = RunConfig().to_dict()
    d["train"]["inner_stepz"] = 3
    with pytest.raises(ConfigError, match="train.inner_stepz"):
        RunConfig.from_dict(d)
    d = RunConfig().to_dict()
    d["train"]["rounds"] = "many"
    with pytest.raises(ConfigError, match="train.rounds must be an integer"):
        RunConfig.from_dict(d)
    with pytest.raises(ConfigError, match="unknown config field 'train.nope'"):
        RunConfig().replace(**{"train.nope": 1})
    with pytest.raises(ConfigError, match="not valid JSON"):
        RunConfig.from_json("{")


def test_load_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        RunConfig.load(tmp_path / "nope.json")
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"num_sites": 2}))
    assert RunConfig.load(p).num_sites == 2


def test_site_names():
    cfg = RunConfig().replace(num_sites=2, sites=["a", "b"])
    assert RunConfig.from_json(cfg.to_json()).sites == ("a", "b")
    with pytest.raises(ConfigError, match="sites must be empty or 2 distinct names"):
        RunConfig().replace(num_sites=2, sites=["a", "a"])
