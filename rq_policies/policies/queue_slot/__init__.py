"""QueueSlot: its rules (``rules``) and what it shows (``views``)."""

from . import views  # noqa: F401 - registers its views
from .rules import WAKE_CAPACITY, WAKE_RELEASED, QueueSlot, queue_name

__all__ = ['QueueSlot', 'WAKE_CAPACITY', 'WAKE_RELEASED', 'queue_name']
