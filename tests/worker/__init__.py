"""PolicyWorker and PolicySimpleWorker end to end: caps and Loner with real forking workers, bootstrap, kill shapes,
the simple worker's keeper, promotion of scheduled jobs."""
