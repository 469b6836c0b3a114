"""Rate: its rules (``rules``)."""

from .rules import Rate

__all__ = ['Rate']
