"""Loss recovery: which parts of a delta matter, how they are protected, what stands in for the
parts that do not arrive in time. Its parts so far: roles by name, XOR parity, chunk loss on purpose."""

from .injector import ChunkLoss, GilbertElliott
from .parity import rebuild, xor_parity
from .roles import ROLES, role_of, roles_of

__all__ = ["ROLES", "role_of", "roles_of", "xor_parity", "rebuild", "ChunkLoss", "GilbertElliott"]
