"""The identity digest every policy keys on.

A policy decides per *identity*: the function's import path, the queue, and the job's arguments. The digest must be
the same in every producer process, on every machine and Python version, so it is a SHA-256 over a canonical, typed
encoding rather than over ``pickle`` or ``repr`` (both of which vary between versions):

* kwargs are order-insensitive; dict keys must be ``str`` and are sorted.
* Types are kept apart: ``1``, ``1.0``, ``True`` and ``'1'`` are four identities. Lists and tuples are one kind
  (a sequence), because rq's JSON serializer turns one into the other and a job should not change identity on the
  way through a serializer.
* ``Decimal`` is normalized (``Decimal('1.0')`` and ``Decimal('1.00')`` are one identity); naive and aware
  ``datetime`` values differ, and an aware one is compared in UTC.
* Anything else raises ``TypeError`` naming the argument, unless the function declares ``unique_context``, which
  narrows the identity to what it returns (that return value must itself be encodable).
"""

from __future__ import annotations

import datetime as _dt
import decimal
import hashlib
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

UniqueContext = Callable[[tuple, dict], Any]


def _encode(value: Any, where: str) -> Any:
    # bool before int: bool is a subclass of int.
    if value is None:
        return ['n']
    if isinstance(value, bool):
        return ['b', int(value)]
    if isinstance(value, int):
        return ['i', str(value)]
    if isinstance(value, float):
        return ['f', repr(value)]
    if isinstance(value, str):
        return ['s', value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ['y', bytes(value).hex()]
    if isinstance(value, decimal.Decimal):
        return ['d', str(value.normalize()) if value.is_finite() else str(value)]
    if isinstance(value, _dt.datetime):
        if value.tzinfo is not None and value.utcoffset() is not None:
            return ['tz', value.astimezone(_dt.timezone.utc).replace(tzinfo=None).isoformat()]
        return ['dt', value.isoformat()]
    if isinstance(value, _dt.date):
        return ['date', value.isoformat()]
    if isinstance(value, uuid.UUID):
        return ['u', str(value)]
    if isinstance(value, Mapping):
        items = []
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f'cannot build a policy identity from {where}: dict key {key!r} is not a str')
            items.append([key, _encode(value[key], f'{where}[{key!r}]')])
        items.sort(key=lambda item: item[0])
        return ['m', items]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return ['l', [_encode(item, f'{where}[{i}]') for i, item in enumerate(value)]]
    raise TypeError(
        f'cannot build a policy identity from {where}={value!r}: {type(value).__name__} has no canonical encoding. '
        'Pass plain values (str, int, float, bool, None, list, tuple, dict with str keys, datetime, date, UUID, '
        'Decimal, bytes), or declare @policy(..., unique_context=lambda args, kwargs: ...) on the job function to '
        'choose what identifies the job.'
    )


def canonical(func_name: str, queue: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bytes:
    """The canonical bytes the digest of a full call is taken over."""
    body = [[_encode(arg, f'args[{i}]') for i, arg in enumerate(args)], _encode(dict(kwargs), 'kwargs')]
    return _pack(func_name, queue, 'call', body)


def _pack(func_name: str, queue: str, kind: str, body: Any) -> bytes:
    payload = ['rq-policies/1', str(func_name), str(queue), kind, body]
    return _JSON.encode(payload).encode('ascii')


#: ``json.dumps(..., separators=(',', ':'), ensure_ascii=True)`` built once: dumps builds a new encoder per call when
#: given options, which cost more than the encoding of a typical call's arguments.
_JSON = json.JSONEncoder(separators=(',', ':'), ensure_ascii=True)


def digest(
    func_name: str,
    queue: str,
    args: Sequence[Any] | None = None,
    kwargs: Mapping[str, Any] | None = None,
    unique_context: UniqueContext | None = None,
    policies: Any = None,
) -> str:
    """The identity digest (64 hex characters) of one call on one queue.

    Args:
        func_name: the function's import path, as rq stores it (``module.qualname``).
        queue: the queue name.
        args: positional arguments.
        kwargs: keyword arguments.
        unique_context: optional ``(args, kwargs) -> value``; when given, only its return value (with the function
            and queue) identifies the job.
        policies: the policies the call is enqueued under (only to name them when ``unique_context`` fails).

    Raises:
        TypeError: an argument (or unique_context's return value) has no canonical encoding, or ``unique_context``
            raised: the error names the function, the policies and the cause (chained), as a failing key function's
            does (:meth:`rq_policies.concurrency.KeyedPolicy.key_of`).
    """
    args = tuple(args or ())
    kwargs = dict(kwargs or {})
    if unique_context is not None:
        try:
            narrowed = unique_context(args, kwargs)
        except Exception as exc:
            raise TypeError(context_failure(unique_context, func_name, policies, exc)) from exc
        data = _pack(func_name, queue, 'context', _encode(narrowed, 'the value unique_context returned'))
    else:
        data = canonical(func_name, queue, args, kwargs)
    return hashlib.sha256(data).hexdigest()


def context_failure(unique_context: Any, func_name: str, policies: Any, exc: BaseException) -> str:
    """The message of a failing ``unique_context``: which hook, on which job function, under which policies, and
    why."""
    hook = getattr(unique_context, '__qualname__', None) or repr(unique_context)
    module = getattr(unique_context, '__module__', None)
    if module and not hook.startswith('<'):
        hook = f'{module}.{hook}'
    named = ''
    if policies:
        named = ', '.join(repr(item) for item in policies) if isinstance(policies, (tuple, list)) else repr(policies)
        named = f' (@policy({named}, unique_context=...))'
    return f'unique_context {hook} of {func_name}{named} failed on this call: {exc!r}'


def func_path(job: Any) -> str:
    """The function part of a job's identity: rq's ``func_name``, qualified by the class for bound methods."""
    instance = job.instance
    if instance is not None:
        cls = type(instance)
        return f'{cls.__module__}.{cls.__qualname__}.{job.func_name}'
    return job.func_name


def function_name(func: Any) -> str:
    """The name rq stores for a plain function (``module.qualname``), or the import path when given one."""
    if isinstance(func, str):
        return func
    return f'{func.__module__}.{func.__qualname__}'
