"""Loner: its rules (``rules``)."""

from .rules import Loner

__all__ = ['Loner']
