"""Loner: unique jobs, their lock modes and conflict strategies."""
