"""Fair: its rules (``rules``) and what it shows (``views``)."""

from . import views  # noqa: F401 - registers its views
from .rules import BacklogFull, Fair, FairStatus, FairWeight

__all__ = ['BacklogFull', 'Fair', 'FairStatus', 'FairWeight']
