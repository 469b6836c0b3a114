"""Batch: many enqueues of one key run as one job (BullMQ Pro's batches, Oban Pro's Chunk, Inngest's ``batchEvents``)::

    @policy(Batch(key=lambda args, kwargs: args[0]['shop'], size=100, max_wait=5))
    def send_events(events): ...            # called with a list of up to 100 payloads of one shop

    q.enqueue(send_events, {'shop': 'acme', 'event': 'sale'})   # a member: one positional argument, its payload

Each enqueue is a *member*: an ordinary rq job with its own id, admitted through the door like any other (the other
policies on the call apply to it), and parked on its key (``rq:policies:keyparked:batch:<scope>:<key>``, status
``deferred``, in rq's deferred registry of its queue) instead of being pushed. A worker's fetch forms one *batch job*
when ``size`` members of a key wait, or ``max_wait`` seconds (server clock) after the key's first waiting member came
(with at least ``min_size`` waiting): one script takes up to ``size`` members off the key, writes the batch job and
pushes it (``lua/policies/batch.lua``'s ``due``, run by the fetch's due phase). The batch job is an ordinary rq job of
the same function, whose one positional argument is the list of its members' payloads, in admission order. A
member's hash names its batch job (``batch_id``: :func:`batch_of`). The design and its limits: docs/batch.md.
"""

from __future__ import annotations

import numbers
import pickle
from typing import Any, ClassVar

from rq.job import Job, JobStatus
from rq.registry import DeferredJobRegistry
from rq.serializers import DefaultSerializer

from rq_policies.engine import compat, keys
from rq_policies.engine.exceptions import InvalidArgument, PolicyConfigurationError
from rq_policies.engine.keyed import KeyedPolicy, KeyFunction, check_scope, keyed_args
from rq_policies.engine.ops import text
from rq_policies.engine.policy import MAX_SECONDS, FetchPolicy, declare_scope, positive_int

__all__ = ['BATCH_FIELD', 'Batch', 'batch_of']

#: The member's job hash field: ``'<size> <max_wait> <min_size> <scope>:<key>'``.
FIELD = 'policies_batch'
#: The member's payload, pickled as a fragment the batch job's ``data`` is joined from (``lua/policies/batch.lua``).
ITEM_FIELD = 'batch_item'
#: The start of the batch job's ``data`` (its function's name), the members' fragments following.
HEAD_FIELD = 'batch_head'
#: The member's field naming the batch job it went into (written when the batch is formed).
BATCH_FIELD = 'batch_id'
#: The largest ``size``: one fetch script forms a batch (about five commands per member, and the batch job's data
#: joined in Lua), so a batch is bounded to keep that script short: 1,000 members of 100-byte payloads took the
#: server 9-17 ms on a loaded 2-core machine (SLOWLOG, three runs), in which the server serves nothing else.
MAX_SIZE = 1000
#: Seconds a member's hash lives once its batch formed (``lua/policies/batch.lua``'s ``BT_MEMBER_TTL``; a shorter
#: ``ttl`` it was enqueued with is kept): the batch job holds the payload, the member is a handle (:func:`batch_of`).
MEMBER_TTL = 86400
#: The batch job's field listing its members' ids, space-separated, in admission order.
MEMBERS_FIELD = 'policies_batch_members'
#: The pickle protocol of the fragments: 3 has no frames (a frame cannot be split into joinable pieces) and pickles
#: bytes natively; rq's own pickle.loads reads it whatever protocol rq writes.
PROTOCOL = 3


def fragment(value: Any) -> bytes:
    """``value`` pickled as a fragment of a larger pickle: no protocol header, no STOP. Fragments joined one after
    another each push their value (a memo index one reuses is overwritten by it, and each reads back only its own)."""
    raw = pickle.dumps(value, protocol=PROTOCOL)
    return raw[2:-1]


def head(func_name: str) -> bytes:
    """The batch job's ``data`` up to its first member: the tuple rq unpickles, ``(func_name, None, ([...],), {})``,
    opened (protocol header, MARK, the name, None, MARK of the args tuple, MARK of the list). ``lua/policies/batch.lua``
    closes it with ``l t } t .`` (the list, the args tuple, empty kwargs, the outer tuple, STOP)."""
    return b'\x80\x03(' + fragment(func_name) + b'N(('


def _wait(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0 or value > MAX_SECONDS:
        raise InvalidArgument('max_wait', message=f'max_wait must be a number of seconds from 0 to {MAX_SECONDS}, '
                                                  f'got {value!r}')
    return float(value)


class Batch(FetchPolicy):
    """Run the enqueues of one key as one job, ``size`` at a time or ``max_wait`` seconds after the first (see the
    module).

    The function receives one positional argument: a list, one item per member in the order they were admitted,
    each item the member's one positional argument (its payload) as it was enqueued. A member is enqueued with
    exactly one positional argument and no keyword arguments (anything else is refused, InvalidArgument naming
    ``args``); so ``q.enqueue(f, {'id': 1})`` and ``q.enqueue(f, {'id': 2})`` of one key run as ``f([{'id': 1},
    {'id': 2}])``.

    Args:
        key: ``(args, kwargs) -> str | int``, the key members are batched by (required: a batch of everything is
            ``key=lambda a, k: 'all'``).
        size: the most members in one batch, an int from 1 to :data:`MAX_SIZE` (1,000): a batch forms as soon as
            ``size`` members of a key wait.
        max_wait: seconds (a number >= 0; server clock) after a key's first waiting member came that a batch forms
            with the members waiting then, fewer than ``size``.
        min_size: the fewest members a batch forms with after ``max_wait`` (an int from 1 to ``size``; default 1):
            below it the key keeps waiting, and the batch forms when the ``min_size``-th member comes.
        scope: the namespace keys are named in (no colon); default: the function's import path. Members of one key
            of one scope batch together whatever their queue; the batch job goes to its first member's queue.

    The batch job copies its first member's job settings (timeout, result and failure ttl, ``Retry``, meta,
    callbacks, the other per-job policies' fields), so a failed batch is retried as a batch by rq's ``Retry``, and a
    per-key Concurrency or Rate counts a batch as one job of its first member's key costing the sum of its members'
    costs, at most the declared limit (docs/batch.md). Members use rq's default (pickle) serializer.
    """

    name: ClassVar[str] = 'batch'
    per_job: ClassVar[bool] = True
    admits: ClassVar[bool] = True
    #: Before Fair (200): a member is parked by Batch, and the batch job, carrying its first member's Fair field,
    #: takes its key's turn.
    rank: ClassVar[int] = 150
    payload_fields: ClassVar[tuple[str, ...]] = (FIELD, ITEM_FIELD)
    #: A key with waiting members is in the due index; nothing else to look at while it is absent.
    fetch_state: ClassVar[tuple[str, ...] | None] = ('keydue',)
    excludes: ClassVar[dict[str, str]] = {
        'loner': 'Batch cannot be combined with Loner: a member never starts on its own, so its marker would hold '
                 'until it expires',
        'debounce': 'Batch cannot be combined with Debounce: a debounced job is scheduled, a member is parked',
    }
    #: The per-key policies' key function handling (Fair's too).
    _key_of = KeyedPolicy.key_of

    def __init__(self, key: KeyFunction | None = None, size: int | None = None, max_wait: float | None = None,
                 min_size: int = 1, scope: str | None = None) -> None:
        if key is None or not callable(key):
            raise InvalidArgument('key', message=f'key must be a callable (args, kwargs) -> str | int, got {key!r}')
        self.size = positive_int('size', size, MAX_SIZE)
        self.max_wait = _wait(max_wait)
        self.min_size = positive_int('min_size', min_size, MAX_SIZE)
        if self.min_size > self.size:
            raise InvalidArgument('min_size', message=f'min_size must be at most size ({self.size}), got '
                                                      f'{min_size!r}')
        self.key = key
        self.scope = None if scope is None else check_scope(scope)
        if self.scope is not None:
            declare_scope(self.name, self.scope)

    def __repr__(self) -> str:
        words = [f'key={getattr(self.key, "__name__", self.key)}', f'size={self.size}',
                 f'max_wait={self.max_wait:g}']
        if self.min_size != 1:
            words.append(f'min_size={self.min_size}')
        if self.scope is not None:
            words.append(f'scope={self.scope!r}')
        return f'Batch({", ".join(words)})'

    # -- the enqueue ----------------------------------------------------------------------------------------------

    def validate(self, job: Any, mode: str, force: bool) -> None:
        if mode not in ('R', 'L'):
            what = {'S': 'scheduled (enqueue_at/enqueue_in)', 'D': 'deferred (depends_on)'}.get(mode, mode)
            raise PolicyConfigurationError(f'{self!r}: a member is parked on its key until its batch forms; it cannot '
                                           f'be {what}')
        if job.instance is not None:
            raise PolicyConfigurationError(f'{self!r}: a member must be a function call, not a method of an instance')
        if job.serializer is not DefaultSerializer and getattr(job.serializer, 'loads', None) is not pickle.loads:
            raise PolicyConfigurationError(f'{self!r}: members use rq\'s default (pickle) serializer, got '
                                           f'{job.serializer!r}')

    def job_fields(self, job: Any, queue: str, digest: str) -> list[Any]:
        if len(job.args) != 1 or job.kwargs:  # asked before validate(), and before anything is written
            raise InvalidArgument('args', message=f'{self!r}: a member is enqueued with exactly one positional '
                                                  f'argument (its payload) and no keyword arguments, got args='
                                                  f'{tuple(job.args)!r} kwargs={dict(job.kwargs)!r}')
        scope, key = self._key_of(job, digest)
        setting = f'{self.size} {self.max_wait:.6f} {self.min_size} {keys.key_id(scope, key)}'
        return [FIELD, setting, ITEM_FIELD, fragment(job.args[0]), HEAD_FIELD, head(job.func_name)]

    def admit_part(self, call: Any, queue: Any, digest: str) -> dict[str, Any]:
        raw = call.job_field(FIELD)
        if raw is None:  # a probe (no job built yet): nothing to check
            return {}
        key_id = raw.split(' ', 3)[3]
        call.key('batch.parked', keys.KEY_PARKED_PREFIX(self.name, key_id))
        call.key('batch.due', keys.KEY_DUE)
        call.key('batch.deferred', DeferredJobRegistry.key_template.format(queue.name))
        return {'key_id': key_id, 'size': self.size, 'max_wait': self.max_wait, 'min_size': self.min_size,
                'wake': keys.wake(queue.name), 'job_prefix': Job.redis_job_namespace_prefix}

    def on_admit(self, job: Any, queue: str, verdict: Any) -> None:
        if verdict.code == 1 and job.get_status(refresh=False) == JobStatus.QUEUED:
            compat.set_local_status(job, JobStatus.DEFERRED)  # parked on its key, as the script wrote it

    # -- the fetch ------------------------------------------------------------------------------------------------

    @classmethod
    def fetch_keys(cls, call: Any, queue_names: list[str]) -> None:
        call.key('keydue', keys.KEY_DUE)
        call.arg('keyed', keyed_args(call.args.get('job_prefix', Job.redis_job_namespace_prefix)))


def batch_of(job: Job, connection: Any = None) -> Job | None:
    """The batch job member ``job`` went into (an rq Job: its ``get_status()`` is the batch's), or None while the
    member waits for its batch to form (or for a job that is no member).

    Args:
        job: a member, as ``enqueue`` returned it (or ``Job.fetch(member_id)``).
        connection: the Redis connection (default: the job's).
    """
    conn = connection if connection is not None else job.connection
    raw = conn.hget(job.key, BATCH_FIELD)
    if raw is None:
        return None
    return Job.fetch(text(raw), connection=conn, serializer=job.serializer)
