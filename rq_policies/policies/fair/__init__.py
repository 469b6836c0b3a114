"""Fair: its rules (``rules``) and what it shows (``views``, imported at the first look at the views:
``rq_policies/policies/__init__.py``)."""

from .rules import BacklogFull, Fair, FairStatus, FairWeight

__all__ = ['BacklogFull', 'Fair', 'FairStatus', 'FairWeight']
