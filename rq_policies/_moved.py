"""Aliases of the documented modules that moved into the three wings (engine, policies, surfaces) in 0.3."""

from __future__ import annotations

import importlib
import sys
import warnings


def alias(old: str, new: str) -> None:
    """Make module ``old`` the module ``new`` (the same object, so its globals are shared), warning once."""
    warnings.warn(f'{old} moved to {new}: import it from there (this alias goes in a later release)',
                  DeprecationWarning, stacklevel=3)
    sys.modules[old] = importlib.import_module(new)
