"""The engine's doors: what an enqueue admits, drops and refuses (hints, mixed workloads, on_drop, bad input,
fuzzing)."""
