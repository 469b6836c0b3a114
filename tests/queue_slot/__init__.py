"""QueueSlot: the cluster-wide cap of a queue (its end-to-end worker tests are in tests/worker)."""
