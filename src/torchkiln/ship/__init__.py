"""The pick as a deployable directory (`kiln ship`) and `load()` in production."""

from torchkiln.ship.api import ship, ship_workload
from torchkiln.ship.load import ShipFallbackWarning, Shipped, load
from torchkiln.ship.manifest import ShipIntegrityError, ShipManifestError, check

__all__ = [
    "ShipFallbackWarning",
    "ShipIntegrityError",
    "ShipManifestError",
    "Shipped",
    "check",
    "load",
    "ship",
    "ship_workload",
]
