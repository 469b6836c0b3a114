"""Integrations with frameworks around rq; each module imports its framework only when it is imported itself."""
