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
* Anything else raises :class:`~rq_policies.engine.exceptions.InvalidArgument` (a TypeError, as before, and a
  ValueError) naming the argument, unless the function declares ``unique_context``, which narrows the identity to
  what it returns (that return value must itself be encodable).
* Nesting deeper than :data:`MAX_DEPTH` (100) levels, a value that contains itself, an int too long to write out,
  an aware datetime out of range in UTC and a Decimal that overflows when normalized raise
  :class:`~rq_policies.engine.exceptions.InvalidArgument` naming the argument and the function, before anything is
  written. Lone surrogates in text are fine here: the encoding escapes them (``ensure_ascii``).
"""

from __future__ import annotations

import datetime as _dt
import decimal
import hashlib
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .exceptions import InvalidArgument

UniqueContext = Callable[[tuple, dict], Any]


#: How deeply arguments may nest (lists, tuples and dicts inside one another) and still identify a job. Deeper
#: nesting, or a value that contains itself, raises :class:`~rq_policies.engine.exceptions.InvalidArgument` naming the
#: argument, instead of the interpreter's RecursionError.
MAX_DEPTH = 100


class _Refused(Exception):
    """Raised inside :func:`_encode`; turned into the public error, with the function's name, by its caller."""

    def __init__(self, where: str, reason: str, value: Any = None, type_error: bool = False) -> None:
        super().__init__(where, reason)
        self.where, self.reason, self.value, self.type_error = where, reason, value, type_error

    def public(self, func_name: str, queue: str, top: str | None = None) -> Exception:
        """The error to raise; ``top`` names the top-level argument (``args[0]``) a too deep value is under, in place
        of its path a hundred subscripts long."""
        if self.type_error:
            return InvalidArgument(
                self.where,
                message=f'cannot build the policy identity of {func_name} (queue {queue!r}) from {self.where}='
                        f'{_short(self.value)}: {self.reason}',
            )
        where = top if top is not None and len(self.where) > 100 else self.where
        return InvalidArgument(where, f'cannot build its policy identity: {self.reason}', func_name,
                               f' (queue {queue!r})')


def _short(value: Any, limit: int = 200) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a repr that fails (or recurses) must not hide the error being reported
        return f'<{type(value).__name__}: repr failed with {type(exc).__name__}>'
    return text if len(text) <= limit else text[: limit - 3] + '...'


def _encode(value: Any, where: str, depth: int = 0) -> Any:
    # bool before int: bool is a subclass of int.
    if value is None:
        return ['n']
    if isinstance(value, bool):
        return ['b', int(value)]
    if isinstance(value, int):
        try:
            return ['i', str(value)]
        except ValueError as exc:  # more digits than sys.get_int_max_str_digits() allows
            raise _Refused(where, f'an int too large to write in decimal ({exc})') from None
    if isinstance(value, float):
        return ['f', repr(value)]
    if isinstance(value, str):
        return ['s', value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ['y', bytes(value).hex()]
    if isinstance(value, decimal.Decimal):
        try:
            return ['d', str(value.normalize()) if value.is_finite() else str(value)]
        except ArithmeticError as exc:  # decimal.Overflow and its kin, under the current decimal context
            raise _Refused(where, f'Decimal {_short(value)} cannot be normalized ({exc!r})') from None
    if isinstance(value, _dt.datetime):
        if value.tzinfo is not None and value.utcoffset() is not None:
            try:
                utc = value.astimezone(_dt.timezone.utc)
            except OverflowError as exc:  # an aware datetime near year 1 or 9999, out of range once in UTC
                raise _Refused(where, f'{value.isoformat()} is out of range in UTC ({exc})') from None
            return ['tz', utc.replace(tzinfo=None).isoformat()]
        return ['dt', value.isoformat()]
    if isinstance(value, _dt.date):
        return ['date', value.isoformat()]
    if isinstance(value, uuid.UUID):
        return ['u', str(value)]
    if isinstance(value, Mapping):
        if depth >= MAX_DEPTH:
            raise _Refused(where, f'nested deeper than {MAX_DEPTH} levels, or it contains itself')
        items = []
        for key in value:
            if not isinstance(key, str):
                raise _Refused(where, f'dict key {_short(key)} is not a str', value, type_error=True)
            items.append([key, _encode(value[key], f'{where}[{key!r}]', depth + 1)])
        items.sort(key=lambda item: item[0])
        return ['m', items]
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        if depth >= MAX_DEPTH:
            raise _Refused(where, f'nested deeper than {MAX_DEPTH} levels, or it contains itself')
        return ['l', [_encode(item, f'{where}[{i}]', depth + 1) for i, item in enumerate(value)]]
    raise _Refused(where, (
        f'{type(value).__name__} has no canonical encoding. Pass plain values (str, int, float, bool, None, list, '
        'tuple, dict with str keys, datetime, date, UUID, Decimal, bytes), or declare '
        '@policy(..., unique_context=lambda args, kwargs: ...) on the job function to choose what identifies the job.'
    ), value, type_error=True)


def canonical(func_name: str, queue: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bytes:
    """The canonical bytes the digest of a full call is taken over."""
    try:
        # kwargs as a mapping one level up: a keyword argument's value is as deep as a positional one's
        body = [[_encode(arg, f'args[{i}]') for i, arg in enumerate(args)], _encode(dict(kwargs), 'kwargs', -1)]
        return _pack(func_name, queue, 'call', body)
    except _Refused as refused:
        raise refused.public(func_name, queue, _top(refused.where, args, kwargs)) from None
    except RecursionError:  # MAX_DEPTH reached from a caller already deep in its own stack
        raise _deep(func_name, queue, args, kwargs) from None


def _top(where: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> str | None:
    """The top-level argument a path (``args[0][1]['x']``) starts with."""
    for name in [*(f'args[{i}]' for i in range(len(args))), *(f'kwargs[{k!r}]' for k in kwargs)]:
        if where == name or where.startswith(name + '['):
            return name
    return None


def _deep(func_name: str, queue: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> InvalidArgument:
    where = 'the arguments'
    for name, value in [*((f'args[{i}]', a) for i, a in enumerate(args)), *((f'kwargs[{k!r}]', v)
                                                                            for k, v in kwargs.items())]:
        if isinstance(value, (Mapping, Sequence)) and not isinstance(value, (str, bytes, bytearray)):
            where = name
            break
    return InvalidArgument(where, 'cannot build its policy identity: nested too deeply for the stack it is encoded '
                           'on', func_name, f' (queue {queue!r})')


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
            does (:meth:`rq_policies.engine.keyed.KeyedPolicy.key_of`).
        InvalidArgument: an argument (or that value) is nested deeper than :data:`MAX_DEPTH` or contains itself, or
            is a number or date that cannot be written out (an int past Python's digit limit, an aware datetime out
            of range in UTC). Both name the argument (``args[1]``, ``kwargs['x'][0]``) and the function.
    """
    args = tuple(args or ())
    kwargs = dict(kwargs or {})
    if unique_context is not None:
        try:
            narrowed = unique_context(args, kwargs)
        except Exception as exc:
            raise InvalidArgument('unique_context', message=context_failure(unique_context, func_name, policies,
                                                                            exc)) from exc
        try:
            data = _pack(func_name, queue, 'context', _encode(narrowed, 'the value unique_context returned'))
        except _Refused as refused:
            raise refused.public(func_name, queue, 'the value unique_context returned') from None
        except RecursionError:
            raise _deep(func_name, queue, (narrowed,), {}) from None
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
