"""QueueSlot: its rules (``rules``)."""

from .rules import WAKE_CAPACITY, WAKE_RELEASED, QueueSlot, queue_name

__all__ = ['QueueSlot', 'WAKE_CAPACITY', 'WAKE_RELEASED', 'queue_name']
