"""Debounce: the last payload of a burst runs once the burst goes quiet."""
