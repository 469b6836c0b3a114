"""The contract every policy keeps with rq: one parametrised suite over all of them."""
