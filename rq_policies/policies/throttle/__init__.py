"""Outcome: its rules (``rules``)."""

from .rules import Outcome

__all__ = ['Outcome']
