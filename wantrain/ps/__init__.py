"""The parameter server: the global model, the rounds, and the gRPC service sites dial.

    server.py     ParameterServer: the composition root; site lifecycle and round driving
    sites.py      SiteLink and the checks on what a site says about itself
    rounds.py     RoundState (sans-IO: who is in the round, can it close) and RoundClock (deadlines)
    uploads.py    a delta as it arrives, and its checks
    commit.py     a round's commit: screening, weights, the new model, telling the sites
    model.py      GlobalModel: parameters, outer optimizer, update codec, evaluation
    downloads.py  model downloads to sites, rate-limited, frozen across commits
    state.py      what is checkpointed
    servicer.py   the gRPC adapter: Session, Watch, Ping, Report
    serve.py      serve(): listen until the run is done
"""

from .serve import serve
from .server import ParameterServer
from .servicer import STATUS, Servicer
from .sites import SiteLink

__all__ = ["ParameterServer", "SiteLink", "Servicer", "STATUS", "serve"]
