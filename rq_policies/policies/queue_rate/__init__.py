"""QueueRate: its rules (``rules``) and what it shows (``views``, imported at the first look at the views:
``rq_policies/policies/__init__.py``)."""

from .rules import BACKOFFS_META, SNOOZES_META, BackOff, QueueRate, RateStatus, Snooze, SnoozeLimitReached

__all__ = ['BACKOFFS_META', 'BackOff', 'QueueRate', 'RateStatus', 'SNOOZES_META', 'Snooze', 'SnoozeLimitReached']
