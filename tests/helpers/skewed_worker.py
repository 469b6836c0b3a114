"""``rq worker`` with this process's clock moved by ``RQ_POLICIES_TEST_SKEW`` seconds (time.time only): the clock-skew
tests run it as ``python -m tests.helpers.skewed_worker worker -w rq_policies.PolicyWorker ...``."""

from __future__ import annotations

import os
import sys
import time

_real = time.time
_skew = float(os.environ.get('RQ_POLICIES_TEST_SKEW', '0'))
time.time = lambda: _real() + _skew  # type: ignore[assignment]

if __name__ == '__main__':
    from rq.cli import main

    sys.argv[0] = 'rq'
    sys.exit(main())
