"""Throttle: one job per identity per slot, the trailing edge, force and reset."""
