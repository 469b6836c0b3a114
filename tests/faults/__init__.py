"""Real faults: lost replies, hold faults, outages, eviction, Sentinel and cluster failovers, and the soak."""
