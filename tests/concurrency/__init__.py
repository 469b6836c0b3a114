"""Per-key Concurrency and Rate: parking, unparking, overrides and real workers."""
