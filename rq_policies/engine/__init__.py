"""The engine: the door core, admission, fetch, ledger, keys, scripts, compat (docs/architecture.md)."""

#: The package's version (the face, ``rq_policies``, re-exports it): here, so a surface reads it without climbing back.
__version__ = '0.1.0'
