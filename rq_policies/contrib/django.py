"""Moved to :mod:`rq_policies.surfaces.contrib.django` (this alias warns once)."""

from rq_policies._moved import alias

alias(__name__, 'rq_policies.surfaces.contrib.django')
