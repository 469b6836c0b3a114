"""Job functions the benchmarks enqueue and run (importable by worker processes)."""


def work(x):
    return x
