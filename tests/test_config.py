import json

import pytest

from wantrain.config import RunConfig
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
    ({"train.late_policy": "wait"}, "train.late_policy"),
    ({"train.loss_budget": 1.0}, "train.loss_budget"),
])
def test_bad_values_name_the_field(change, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        RunConfig().replace(**change)


def test_partial_deltas_count_only_under_a_policy_with_a_substitute():
    assert RunConfig().train.counts_partial                       # the default: zero-outside, partial deltas
    for policy in ("drop", "stale"):                              # a late delta whole or not at all
        assert not RunConfig().replace(**{"train.late_policy": policy}).train.counts_partial
    assert not RunConfig().replace(**{"train.partial_deltas": False}).train.counts_partial


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
