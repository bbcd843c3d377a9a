"""Loss recovery: which parts of a delta matter, how they are protected, what stands in for the
parts that do not arrive in time. Its parts: roles by name, a delta's manifest, XOR parity, the
order of transmissions, chunk loss on purpose; beside them, not imported here (they need torch, or
serve only the in-process study): the sensitivity probe (probe.py) and the Hadamard spread of
baseline B5 (spread.py)."""

from .injector import ChunkLoss, GilbertElliott
from .manifest import DEFAULT_ROLE_WEIGHTS, ChunkEntry, Manifest, build_manifest, promote, protect
from .parity import rebuild, xor_parity
from .roles import ROLES, role_of, roles_of
from .sending import (MAX_HEDGES, PROTECT_FULL_AT, ProtectionGauge, Transmission, group_parities, overhead_bytes,
                      still_missing, to_resend, transmissions)

__all__ = ["MAX_HEDGES", "ROLES", "role_of", "roles_of", "xor_parity", "rebuild", "ChunkLoss", "GilbertElliott",
           "ChunkEntry", "Manifest", "DEFAULT_ROLE_WEIGHTS", "build_manifest", "protect", "promote",
           "Transmission", "transmissions", "still_missing", "to_resend", "overhead_bytes", "ProtectionGauge",
           "PROTECT_FULL_AT", "group_parities"]
