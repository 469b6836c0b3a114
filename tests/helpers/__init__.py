"""Everything the tests share that is not a test: the job modules real workers import (``jobs``, ``key_jobs``, ...),
the worker launchers (``workers``), the fault proxy (``faultproxy``), the cluster and Sentinel harnesses, the
soak (``python -m tests.helpers.soak``) and the scripts tests run as subprocesses (``python -m
tests.helpers.cluster_worker`` and the like).

A job function is found by its import path, ``tests.helpers.jobs.plain``, the same in the test process (pytest puts
the repository's root on ``sys.path``: tests/ is a package) and in a worker subprocess (:func:`with_root` puts the
root on its ``PYTHONPATH``). Nothing here inserts into ``sys.path``.

This module stays light (no Redis, no rq): ``python -m tests.helpers.skewed_worker`` imports it before it moves
the clock."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

#: The repository's root (the folder holding tests/, rq_policies/, examples/, docs/).
ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / 'tests'
EXAMPLES = ROOT / 'examples'
DOCS = ROOT / 'docs'
PACKAGE = ROOT / 'rq_policies'


def with_root(env: dict, *first: os.PathLike | str) -> dict:
    """``env`` (a subprocess's environment) with ``first`` then the repository's root at the head of ``PYTHONPATH``
    (once each), so a subprocess imports ``tests.helpers...`` and ``rq_policies`` as this process does."""
    head = [str(path) for path in (*first, ROOT)]
    rest = [part for part in env.get('PYTHONPATH', '').split(os.pathsep) if part and part not in head]
    return dict(env, PYTHONPATH=os.pathsep.join(head + rest))


def load_example(name: str) -> ModuleType:
    """examples/<name>.py imported as the module ``name`` (as ``python examples/<name>.py`` would name its jobs
    module's callers), from its file: examples/ is not a package."""
    import importlib.util
    import sys

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
