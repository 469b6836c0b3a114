"""BACKOFFS_META: its rules (``rules``)."""

from .rules import BACKOFFS_META, SNOOZES_META, BackOff, QueueRate, RateStatus, Snooze, SnoozeLimitReached

__all__ = ['BACKOFFS_META', 'BackOff', 'QueueRate', 'RateStatus', 'SNOOZES_META', 'Snooze', 'SnoozeLimitReached']
