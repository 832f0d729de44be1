"""Backends that need more than a wrapper: each folder holds its configuration (the registry
entry), its arm builder and, where it needs one, its own measurement protocol. Importing this
package registers them (the variant registry does, when it is first asked for its backends)."""

from torchkiln.backends.xla import config as _xla_config  # noqa: F401  (registers xla)
