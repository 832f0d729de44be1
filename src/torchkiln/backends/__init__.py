"""Backends that need more than a wrapper: each folder holds its configuration (the registry
entry), its arm builder and, where it needs one, its own measurement protocol."""
