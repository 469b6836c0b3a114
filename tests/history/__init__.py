"""The history check (issue "Proof over long runs"): producers, workers and nemeses record what happened
(:mod:`tests.history.events`), and a checker reads the history and reports, per property, the violations with the
events that show them."""
