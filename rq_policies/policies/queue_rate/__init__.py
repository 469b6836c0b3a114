"""QueueRate: its rules (``rules``) and what it shows (``views``)."""

from . import views  # noqa: F401 - registers its views
from .rules import BACKOFFS_META, SNOOZES_META, BackOff, QueueRate, RateStatus, Snooze, SnoozeLimitReached

__all__ = ['BACKOFFS_META', 'BackOff', 'QueueRate', 'RateStatus', 'SNOOZES_META', 'Snooze', 'SnoozeLimitReached']
