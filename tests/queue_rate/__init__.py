"""QueueRate, Snooze and BackOff: a queue's start rate."""
