"""Batch: its rules (``rules``) and what it shows (``views``, imported at the first look at the views:
``rq_policies/policies/__init__.py``)."""

from .rules import Batch, batch_of

__all__ = ['Batch', 'batch_of']
