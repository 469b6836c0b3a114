"""LimitedCapacityWorker: its rules (``rules``)."""

from .rules import LimitedCapacityWorker

__all__ = ['LimitedCapacityWorker']
