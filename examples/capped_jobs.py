"""The job function of the capped_queue example; workers import it by path, so it lives in a module of its own."""

import time


def render_report(report_id: int, seconds: float) -> str:
    time.sleep(seconds)  # stands in for work that must not run more than N at a time (an API quota, a DB pool)
    return f'report {report_id} rendered'
