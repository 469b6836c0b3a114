"""Debounce: its rules (``rules``) and what it shows (``views``)."""

from . import views  # noqa: F401 - registers its views
from .rules import Debounce

__all__ = ['Debounce']
