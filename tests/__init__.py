"""The test suite, a package: tests of each policy in a folder of its own (tests/loner, tests/throttle, ...), tests of
each engine part likewise (tests/engine, tests/worker, tests/faults, tests/surfaces, tests/contract), and every
helper and job module in :mod:`tests.helpers`. The repository's root is what makes ``tests`` importable: pytest
puts it first on ``sys.path`` (this file makes tests/ a package), and worker subprocesses get it on their
``PYTHONPATH`` (:func:`tests.helpers.with_root`), so a job function imports as ``tests.helpers.jobs.plain`` in both."""
