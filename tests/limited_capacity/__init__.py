"""LimitedCapacityWorker: refill, self re-enqueue, the running ledger."""
