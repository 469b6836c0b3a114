"""Concurrency: its rules (``rules``) and what it shows (``views``, imported at the first look at the views:
``rq_policies/policies/__init__.py``)."""

from .rules import Concurrency, KeyedPolicy, KeyFunction

__all__ = ['Concurrency', 'KeyFunction', 'KeyedPolicy']
