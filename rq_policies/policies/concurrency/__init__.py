"""Concurrency: its rules (``rules``) and what it shows (``views``)."""

from . import views  # noqa: F401 - registers its views
from .rules import Concurrency, KeyedPolicy, KeyFunction

__all__ = ['Concurrency', 'KeyFunction', 'KeyedPolicy']
