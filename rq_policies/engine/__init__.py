"""The engine: the door core, admission, fetch, ledger, keys, scripts, compat (docs/architecture.md)."""

#: The package's version (the face, ``rq_policies``, re-exports it): here, so a surface reads it without climbing back.
#: The one place it is written: setup.py reads it from this file, and CHANGELOG.md's newest heading names it
#: (tests/engine/test_version.py).
__version__ = '0.3.0'
