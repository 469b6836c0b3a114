"""How the CLI and the page show times and identities to a person.

* A moment is shown as local ISO time plus how far it is from now: ``2026-12-02T13:45:12+01:00 (in 5 s)``,
  ``... (12 s ago)``. The state is measured on the Redis server's clock (every expiry and rate is); a moment is shown
  at the same distance from the reader's own clock, so "in 5 s" is true whatever the skew between the two clocks.
* An identity is shown as its holder job's description, as rq stores it (``tasks.sweep_cache(1)``), cut to a width;
  the 64-character digest stays in ``--json`` (and ``info --digests``), where a script or a ``reset`` needs it.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

__all__ = ['at', 'cut', 'identity', 'in_seconds', 'local_iso', 'relative', 'span']

#: How wide an identity (a job's description) is shown by default.
WIDTH = 40


def span(seconds: float) -> str:
    """A duration in words a person reads at a glance: ``0.4 s``, ``5 s``, ``3 min``, ``2.5 h``, ``3 d``."""
    seconds = abs(seconds)
    if seconds < 10:
        return f'{seconds:.1f} s'.replace('.0 s', ' s')
    if seconds < 120:
        return f'{seconds:.0f} s'
    if seconds < 7200:
        return f'{seconds / 60:.0f} min'
    if seconds < 172800:
        return f'{seconds / 3600:.1f} h'.replace('.0 h', ' h')
    return f'{seconds / 86400:.1f} d'.replace('.0 d', ' d')


def relative(seconds: float) -> str:
    """``in 5 s`` for a moment ``seconds`` ahead, ``12 s ago`` for one behind, ``now`` within 50 ms."""
    if abs(seconds) < 0.05:
        return 'now'
    return f'in {span(seconds)}' if seconds > 0 else f'{span(seconds)} ago'


def local_iso(epoch: float) -> str:
    """An epoch second as local ISO time to the second, with its UTC offset."""
    return datetime.fromtimestamp(epoch).astimezone().isoformat(timespec='seconds')


def in_seconds(seconds: float) -> str:
    """The moment ``seconds`` from now: ``2026-12-02T13:45:12+01:00 (in 5 s)``."""
    return f'{local_iso(time.time() + seconds)} ({relative(seconds)})'


def at(epoch: float, now: float) -> str:
    """A server-clock moment ``epoch`` seen at server time ``now``, as :func:`in_seconds` shows it."""
    return in_seconds(epoch - now)


def cut(value: str, width: int = WIDTH) -> str:
    """``value`` on one line, cut to ``width`` characters (``...`` marks a cut); 0 never cuts."""
    flat = ' '.join(value.split())
    if width <= 0 or len(flat) <= width:
        return flat
    return flat[: max(width - 3, 1)] + '...'


def identity(row: dict[str, Any], width: int = WIDTH, digests: bool = False) -> str:
    """An identity row (``info --json``'s entries) as a person reads it: its holder job's description, cut to
    ``width``, else its job id, else the digest's first 12 characters; ``digests`` appends the whole digest."""
    description = row.get('job_description')
    job_id = row.get('job_id') or (row.get('fields') or {}).get('job')
    shown = cut(description, width) if description else (f'job {job_id}' if job_id else row['digest'][:12])
    return f'{shown}  [{row["digest"]}]' if digests else shown

