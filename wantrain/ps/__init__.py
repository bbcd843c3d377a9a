"""The parameter server: the global model, the rounds, and the gRPC service sites dial.

    server.py     ParameterServer: the composition root; site lifecycle, round driving, telling
                  the sites what each commit did
    ledger.py     the committed state besides the arrays: round, hashes, sites ever seen
    sites.py      SiteLink and the checks on what a site says about itself
    rounds.py     RoundState (sans-IO: who is in the round, can it close) and RoundClock (deadlines)
    uploads.py    a delta as it arrives, and its checks
    commit.py     Committer: screening, weights, the new model, the journal; returns what it committed
    model.py      GlobalModel: parameters, outer optimizer, update codec, evaluation
    downloads.py  model downloads to sites, rate-limited, frozen across commits
    catchup.py    the recent rounds' updates, for a site that comes back holding an earlier model
    state.py      what is made durable (from the ledger, the model, the screen) and how it comes back
    journal.py    a commit record per round and the deltas it counted
    connections.py  the sockets the PS holds, and shedding a flood of unauthenticated ones
    servicer.py   the gRPC adapter: Session, Watch, Ping, Report
    serve.py      serve(): listen until the run is done
"""

from .serve import serve
from .server import ParameterServer
from .servicer import STATUS, Servicer
from .sites import SiteLink

__all__ = ["ParameterServer", "SiteLink", "Servicer", "STATUS", "serve"]
