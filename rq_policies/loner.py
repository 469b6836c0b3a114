"""Loner: one job per identity per queue while it waits (resque-loner's unique jobs).

The marker ``rq:policies:loner:<queue>:<digest>`` names the waiting job; it is taken in the admission script
(``lua/admit.lua`` with this policy's part, ``lua/policies/loner.lua``) and freed in the same script that takes the
job off the queue, or when the job is deleted, cancelled or removed (``lua/release_markers.lua``). A marker whose job
no longer waits is free, so no reaper is needed.
"""

from __future__ import annotations

from typing import Any, ClassVar

from . import keys
from .ops import Call
from .policy import AdmissionPolicy

#: Seconds a "seen held" hint is trusted to pick the probe first (a marker can be freed at any moment, when a worker
#: takes the job, so a loner hint is kept only briefly; a stale one costs one extra round trip before the full path).
HINT_SECONDS = 5.0


class Loner(AdmissionPolicy):
    """One job per identity per queue while it waits (resque-loner's unique jobs).

    The identity is held from the enqueue until a PolicyWorker takes the job (or it is deleted, cancelled or removed
    from its queue); an identical enqueue in that time returns ``None``. Once the job runs, the same payload can be
    enqueued again: the policy prevents duplicate *waiting* work, not concurrent runs.
    """

    name: ClassVar[str] = 'loner'
    rank: ClassVar[int] = 50

    def admit_part(self, call: Call, queue: Any, digest: str) -> dict[str, Any]:
        call.key('loner.marker', keys.loner(queue.name, digest))
        return {}

    def job_fields(self, queue: str, digest: str) -> list[str]:
        return [keys.LONER_FIELD, keys.loner(queue, digest)]

    def leased_keys(self, queue: str, digest: str) -> list[str]:
        return [keys.loner(queue, digest)]

    @classmethod
    def release(cls, connection: Any, job_prefix: str, job_ids: list[str]) -> None:
        release_markers(connection, job_prefix, job_ids)

    @classmethod
    def holder(cls, connection: Any, queue: str, digest: str, job_prefix: str) -> str | None:
        """The id of the waiting job holding ``digest``'s marker on ``queue``, or None."""
        return holder(connection, queue, digest, job_prefix)

    def hint_seconds(self, verdict: Any) -> float:
        return HINT_SECONDS if verdict.code == 0 and verdict.policy == self.name else 0.0

    @classmethod
    def examples(cls) -> tuple[AdmissionPolicy, ...]:
        return (cls(),)

    #: Constructor arguments this policy refuses, each with the argument its error names (the contract suite).
    invalid: ClassVar[tuple[tuple[dict[str, Any], str], ...]] = ()

    @classmethod
    def identity_families(cls) -> tuple[keys.Family, ...]:
        return (keys.LONER_KEYS,)

    @classmethod
    def describe(cls, family: keys.Family, block: dict[str, Any]) -> list[str]:
        stale = block['count'] - block['waiting']
        lines = [f'  loner     {block["waiting"]} waiting' + (f', {stale} stale' if stale else '')]
        for row in block['entries']:
            lines.append(f'    {row["digest"][:12]}  job {row["job_id"]} ({row["job_status"] or "gone"})')
        return lines

    @classmethod
    def reset_part(cls, call: Call, queue: str, digest: str, declared: AdmissionPolicy | None) -> dict[str, Any]:
        call.key('loner.marker', keys.loner(queue, digest))
        return {}


def holder(connection: Any, queue: str, digest: str, job_prefix: str) -> str | None:
    """The id of the waiting job holding ``digest``'s marker on ``queue``, or None."""
    call = Call('loner_holder', job_prefix=job_prefix)
    call.key('marker', keys.loner(queue, digest))
    found = call.run(connection)
    if isinstance(found, bytes):
        return found.decode()
    return found if isinstance(found, str) else None  # on a pipeline the answer arrives with its execute()


def release_markers(connection: Any, job_prefix: str, job_ids: list[str]) -> int:
    """Delete the loner markers that still name these jobs. Returns how many were deleted.

    On a pipeline the release rides it (the count arrives with its ``execute()``, and 0 is returned here).
    """
    if not job_ids:
        return 0
    result = Call('release_markers', job_prefix=job_prefix, jobs=list(job_ids)).run(connection)
    return result if isinstance(result, int) else 0
