"""Debounce: its rules (``rules``)."""

from .rules import Debounce

__all__ = ['Debounce']
