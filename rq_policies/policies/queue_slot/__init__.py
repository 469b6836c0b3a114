"""QueueSlot: its rules (``rules``) and what it shows (``views``, imported at the first look at the views:
``rq_policies/policies/__init__.py``)."""

from .rules import WAKE_CAPACITY, WAKE_RELEASED, QueueSlot, queue_name

__all__ = ['QueueSlot', 'WAKE_CAPACITY', 'WAKE_RELEASED', 'queue_name']
