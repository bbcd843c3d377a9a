"""The panel's PS placement: the regions the parameter server could run in, ranked by the round time
the panel's sites (as edited) and settings would see there (wantrain.launch.ps_regions), and the move to
one of them (Run.move_ps). The view owns its widgets and what they show; the panel says what to rank
and does the move."""

from __future__ import annotations

import dataclasses
import html
from collections.abc import Callable
from pathlib import Path

from ..launch.plan import RunPlan
from ..launch.ps_regions import costs_from_step, rank
from ..launch.round_model import Prediction

__all__ = ["PlacementView", "ranked_regions"]


def ranked_regions(scenario: str | Path, edited: RunPlan, cfg, python: str) -> tuple[list[tuple[str, Prediction]], str]:
    """(region, prediction) fastest first for the sites of `edited` (a scenario's plan with a panel's
    edits) under `cfg`, each region's RTTs from the testbed's table; and where the costs came from."""
    from ..launch.emulator import describe_placements

    plans = {region: plan.replace(sites=tuple(dataclasses.replace(mine, rtt_ms=there.rtt_ms)
                                              for mine, there in zip(edited.sites, plan.sites)))
             for region, plan in describe_placements(str(scenario), python).items()}
    costs, source = costs_from_step(edited, cfg)
    return rank(plans, costs), source


class PlacementView:
    """A "Rank PS regions" button, the ranking as a table, and "Move PS" to a region of it."""

    def __init__(self, on_rank: Callable[[], object], on_move: Callable[[str | None], object]) -> None:
        import ipywidgets as W

        self.rank_button = W.Button(description="Rank PS regions", icon="globe",
                                    tooltip="the round time these sites and settings would see with the PS in "
                                            "each region (RTTs from the scenario's table, an inner step timed here)")
        self.rank_button.add_class("wantrain-place")
        self.rank_button.on_click(lambda _: on_rank())
        self.move_to = W.Dropdown(options=[], description="move PS to", tooltip="the ranked regions, fastest first")
        self.move_button = W.Button(description="Move PS", button_style="warning", disabled=True,
                                    tooltip="stop the PS, start it again from its checkpoint in that region (the "
                                            "links take its RTTs); the sites follow by themselves")
        self.move_button.add_class("wantrain-move-ps")
        self.move_button.on_click(lambda _: on_move(self.move_to.value))
        self.table = W.HTML("")
        self.box = W.VBox([W.HBox([self.rank_button, self.move_to, self.move_button],
                                  layout=W.Layout(flex_flow="row wrap")), self.table])

    def show(self, ranking: list[tuple[str, Prediction]], source: str, scenario_region: str) -> None:
        self.move_to.options = [region for region, _ in ranking]
        cells = "".join(f"<tr><td>{i}</td><td>{html.escape(region)}"
                        f"{' (the scenario&#39;s)' if region == scenario_region else ''}</td>"
                        f"<td>{p.round_s:.2f}</td><td>{html.escape(p.reason())}</td></tr>"
                        for i, (region, p) in enumerate(ranking, 1))
        self.table.value = (f"<div class='wantrain-placement'><b>Where the PS could run</b> (costs: "
                            f"{html.escape(source)})<table><tr><th></th><th>PS region</th><th>round s</th>"
                            f"<th>what sets it</th></tr>{cells}</table></div>")
