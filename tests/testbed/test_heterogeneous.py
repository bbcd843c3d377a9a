"""Time-budgeted rounds keep uneven sites busy: speed factors 1, 2 and 4 through the emulated WAN."""

import pytest

from wantrain.run import Run
from wantrain.telemetry import rows, utilization

from ..helpers import small_config

BUDGET_S = 12.0   # the overhead per round (push, aggregate, update) is about 0.9 s here


@pytest.mark.timeout(300)
def test_sites_of_speed_1_2_4_compute_at_least_90_percent_of_the_round(tmp_path):
    cfg = small_config(**{"train.rounds": 3, "train.round_budget_s": BUDGET_S})
    with Run(cfg, run_dir=tmp_path / "run", scenario="heterogeneous") as run:
        events = list(run.follow(timeout_s=240))
    use = utilization(events)
    print("\n" + "\n".join(f"{s}: {u['utilization']:.1%} computing ({u['compute_s']:.1f} of {u['wall_s']:.1f} s)"
                           for s, u in sorted(use.items())))
    assert set(use) == {"fast", "medium", "slow"}
    assert all(u["utilization"] >= 0.90 and u["rounds"] == 3 for u in use.values()), use
    steps = {s: sum(e["steps"] for e in rows(events, "site_round") if e["site"] == s) for s in use}
    assert steps["fast"] > 1.5 * steps["medium"] and steps["medium"] > 1.5 * steps["slow"], steps
    # The PS weights by tokens, and says per site what each did and how long it idled.
    ends = rows(events, "round_end")
    assert all(set(e["per_site"]) == set(use) for e in ends)
    assert all(d["tokens"] == d["steps"] * 4 * 64 and d["idle_s"] >= 0 for e in ends for d in e["per_site"].values())
