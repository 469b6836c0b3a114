"""Concurrency: its rules (``rules``)."""

from .rules import Concurrency, KeyedPolicy, KeyFunction

__all__ = ['Concurrency', 'KeyFunction', 'KeyedPolicy']
