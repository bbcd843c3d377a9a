"""The committed state of a run, apart from the model's arrays: which round, which parameters.

`Ledger` is the one owner of what a commit changes besides the model: the run's id, the number
of committed rounds, the parameter hash after each, the last validation loss, every site ever
seen (its index, so a site keeps its data shard whatever order sites join in) and how far each
has drawn through its data. A commit advances it (commit.py); a checkpoint or a journal record
is its `state_dict` and brings it back with `load_state_dict` (state.py). Everything else reads it.
"""

from __future__ import annotations

__all__ = ["Ledger"]


class Ledger:
    """Round, hashes and the site registry as of the last committed round."""

    def __init__(self, run_id: str, model_hash: str, val_loss: float = float("nan")) -> None:
        self.run_id = run_id
        self.round = 0                          # committed rounds: the next round to run
        self.hash = model_hash                  # of the parameters after `round` rounds
        self.hashes: dict[int, str] = {0: model_hash}
        self.val_loss = val_loss
        self.registry: dict[str, int] = {}      # every site ever seen -> index
        self.data_positions: dict[str, int] = {}    # batches each site has drawn, as last reported

    def advance(self, model_hash: str, val_loss: float) -> int:
        """Record a committed round; returns the round it was (the ledger now stands after it)."""
        committed = self.round
        self.round += 1
        self.hash = self.hashes[self.round] = model_hash
        self.val_loss = val_loss
        return committed

    def enrol(self, site: str, index: int) -> tuple[int, bool]:
        """The site's index, given it once (`index` is used only the first time); and whether it was known."""
        known = site in self.registry
        return self.registry.setdefault(site, index), known

    def drew(self, site: str, position: int) -> None:
        """A site reported how many batches it has drawn; positions only move forward."""
        self.data_positions[site] = max(self.data_positions.get(site, 0), position)

    def state_dict(self) -> dict:
        """What a checkpoint keeps (its "round" is the next round to run; hashes only in a full
        checkpoint: a commit record carries the one hash of its round, journal.py)."""
        return {"run_id": self.run_id, "round": self.round, "registry": dict(self.registry),
                "data_positions": dict(self.data_positions), "val_loss": self.val_loss}

    def load_state_dict(self, saved: dict, hashes: dict[int, str]) -> None:
        """Stand where `saved` stood; `hashes` are every round's up to and including its round."""
        self.run_id, self.round, self.val_loss = saved["run_id"], int(saved["round"]), float(saved["val_loss"])
        self.hashes = dict(hashes)
        self.hash = self.hashes[self.round]
        self.registry = dict(saved["registry"])
        self.data_positions = {k: int(v) for k, v in saved.get("data_positions", {}).items()}
