"""BacklogFull: its rules (``rules``)."""

from .rules import BacklogFull, Fair, FairStatus, FairWeight

__all__ = ['BacklogFull', 'Fair', 'FairStatus', 'FairWeight']
