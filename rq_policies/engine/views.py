"""What a policy shows, as data: its commands, its metrics and its headings, described by the policy and rendered by
one generic renderer each (``rq_policies.surfaces.cli`` for commands and ``info``'s lines,
``rq_policies.surfaces.metrics`` for Prometheus).

A policy module holds its rules; it never imports click, Flask or prometheus_client
(``tests/engine/test_architecture.py`` checks every policy module's imports, function-local ones included). Instead its
hooks return these descriptions:

* :meth:`~rq_policies.engine.policy.Policy.commands`: the ``rq-policies`` subcommands it adds, as :class:`Setting`
  (show,
  set or ``--clear`` one run-time setting: ``cap``, ``rate``, ``override``, ``fair weight``), :class:`Command` (any
  other: ``keys``, ``fair pause``) and :class:`Group` (``fair ...``). Their arguments and options are
  :class:`Argument` and :class:`Option`, integer ones checked by :class:`Digits`; what a command prints is a
  :class:`Reply` (lines, or the value its ``--json`` prints). A refusal is a :class:`BadArgument` (naming the
  argument: exit 2) or a :class:`UsageError` (exit 2), raised before anything is written.
* :meth:`~rq_policies.engine.policy.Policy.metrics`: its Prometheus families, as :class:`Metric` (name, help, kind,
  labels,
  samples).
* what ``info`` shows: a :class:`Section` per policy and queue
  (:meth:`~rq_policies.engine.policy.FetchPolicy.queue_info`)
  and per policy for its state that belongs to no queue (:meth:`~rq_policies.engine.policy.Policy.cluster_info`): a
  dataclass whose fields are the value ``info --json`` prints (:meth:`Section.as_json`) and whose methods say the
  words of the text from those same fields (:meth:`Section.headline`, :meth:`Section.rows`: :class:`Row` (a label,
  its text, the entries under it) under a queue, plain strings, and a :class:`Heading` where the renderer puts a bold
  head), so a policy writes its state once and both outputs come from the one object.

The renderers own the presentation (click's parameter types and styles, prometheus_client's families); the
descriptions own the words, so an output stays what it was when its renderer changes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, Literal, Union

if TYPE_CHECKING:
    from redis import Redis

#: A command's parsed values, by parameter name (an argument's or option's ``dest``, plus ``as_json``/``force``/
#: ``clear`` where the command has them), as the command's functions get them.
Values = Mapping[str, object]


class UsageError(Exception):
    """The command line asks for something that means nothing (``give either N or --clear, not both``): exit 2."""


class BadArgument(ValueError):
    """A value the command line gave is refused; ``hint`` names the argument (``'QUEUE'``, ``'--burst'``; None:
    the message names it). Exit 2, before anything is written."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


#: An integer as an operator types it: ASCII digits 0-9 and nothing else (``int()`` would also take ``' 3'``,
#: ``'3\n'``, ``'1_000'`` and other scripts' digits such as ``'٣'``).
DIGITS = re.compile(r'[0-9]+')


def why_not_digits(text: str) -> str:
    """What makes ``text`` more than plain digits, in words."""
    if not text:
        return 'it is empty'
    if text != text.strip():
        return 'it has leading or trailing whitespace'
    if '_' in text:
        return 'digit-group underscores are not accepted'
    if any(not ch.isascii() for ch in text):
        return 'only ASCII digits 0-9 are accepted'
    if text[0] in '+-':
        return 'no sign is accepted'
    return 'only decimal digits 0-9 are accepted'


@dataclass(frozen=True)
class Digits:
    """An integer argument: plain ASCII decimal digits in ``[minimum, maximum]``.

    Attributes:
        what: how a refusal names a valid value (``a positive integer up to 2147483647``).
        minimum: the smallest value accepted.
        maximum: the largest value accepted, None for no bound.
    """

    what: str
    minimum: int = 0
    maximum: int | None = None

    def parse(self, value: object, hint: str | None = None) -> int:
        """``value`` (text as typed, or an int default) as an int, or a :class:`BadArgument` saying what is wrong
        with it, naming ``hint``."""
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = value if isinstance(value, str) else str(value)
        if not DIGITS.fullmatch(text):
            raise BadArgument(f'must be {self.what}, got {text!r}: {why_not_digits(text)}', hint)
        number = int(text)
        if number < self.minimum or (self.maximum is not None and number > self.maximum):
            raise BadArgument(f'must be {self.what}, got {text!r}', hint)
        return number


#: How a parameter's text is read: as text (``str``), as Python's ``int`` (a sign allowed), or by a :class:`Digits`.
Kind = Union[Digits, type[str], type[int]]


@dataclass(frozen=True)
class Argument:
    """A positional argument.

    Attributes:
        name: its parameter name (``'queue'``); the usage line shows it upper-cased, or as ``metavar``.
        required: False for an optional one (a :class:`Setting`'s value always is).
        kind: how its text is read.
        metavar: what the usage line calls it (``'LIMIT/PER'``), None for the upper-cased name.
    """

    name: str
    required: bool = True
    kind: Kind = str
    metavar: str | None = None

    @property
    def label(self) -> str:
        """How messages name it: ``N``, ``LIMIT/PER``."""
        return self.metavar or self.name.upper()


@dataclass(frozen=True)
class Option:
    """An option.

    Attributes:
        flag: its flag (``'--limit'``).
        dest: its parameter name (``'limit'``).
        help: its line in ``--help``.
        default: its value when not given (text is read by ``kind`` only when typed; a :class:`Command`'s
            ``prepare`` reads it otherwise).
        is_flag: an on/off flag (no value).
        kind: how its text is read; None: kept as typed.
    """

    flag: str
    dest: str
    help: str
    default: object = None
    is_flag: bool = False
    kind: Kind | None = None


@dataclass(frozen=True)
class Reply:
    """What a command prints: ``data`` as JSON (``--json``; indented, keys sorted) when it is not None, else
    ``lines``."""

    lines: tuple[str, ...] = ()
    data: object = None


@dataclass(frozen=True)
class Command:
    """A subcommand: ``NAME ARGUMENTS... OPTIONS...`` and the connection options every command takes.

    Attributes:
        name: its name on the command line.
        help: its ``--help`` text (the first sentence is its line in the group's list).
        run: what it does, given a connection and the values: what it prints.
        arguments: its positional arguments, in order.
        options: its options, in the order ``--help`` lists them.
        prepare: checks and reads the values before the command connects (a refusal here writes nothing and needs
            no server), returning the values ``run`` gets.
    """

    name: str
    help: str
    run: Callable[[Redis, Values], Reply]
    arguments: tuple[Argument, ...] = ()
    options: tuple[Option, ...] = ()
    prepare: Callable[[Values], Values] | None = None


@dataclass(frozen=True)
class Setting:
    """A command that shows, sets or clears one run-time setting: ``NAME TARGETS... [VALUE] [OPTIONS] [--clear]
    [--force] [--json]``.

    The renderer refuses VALUE with ``--clear`` (a :class:`UsageError`), calls ``prepare`` with the mode
    (``'status'``, ``'set'`` or ``'clear'``), connects, and for a change of a command with ``force_help`` refuses a
    queue nothing has seen unless ``--force`` or ``--clear`` (the first target is the queue); then it calls
    ``status``, ``set`` or ``clear`` and prints the reply.

    Attributes:
        name: the command's name (``'cap'``).
        help: its ``--help`` text.
        targets: the arguments naming what the setting is of (``QUEUE``; ``SCOPE KEY``).
        value: the optional argument that sets it (``N``); absent with no ``--clear``: show the setting.
        clear_help: ``--clear``'s help line.
        status, set, clear: what each mode does, given a connection and the values.
        prepare: checks and reads the values before the command connects, per mode.
        options: options between the value and ``--clear`` (QueueRate's ``--burst``).
        force_help: ``--force``'s help line; None: no ``--force`` and no check of the queue.
        json_help: ``--json``'s help line; None: no ``--json``.
    """

    name: str
    help: str
    targets: tuple[Argument, ...]
    value: Argument
    clear_help: str
    status: Callable[[Redis, Values], Reply]
    set: Callable[[Redis, Values], Reply]
    clear: Callable[[Redis, Values], Reply]
    prepare: Callable[[Values, str], Values] | None = None
    options: tuple[Option, ...] = ()
    force_help: str | None = None
    json_help: str | None = None


@dataclass(frozen=True)
class Group:
    """A group of subcommands (``rq-policies fair pause ...``)."""

    name: str
    help: str
    commands: tuple[Command | Setting, ...]


#: What :meth:`rq_policies.engine.policy.Policy.commands` returns items of.
View = Union[Command, Setting, Group]


@dataclass(frozen=True)
class Row:
    """A row of state ``info`` shows under a queue: a label (``'hold'``, ``'loner'``), its text, and the entries
    listed under it (one line each); the renderer lays them out (the label in a column, the entries indented)."""

    label: str
    text: str
    items: tuple[str, ...] = ()


class Heading(str):
    """A line of ``info`` whose first ``len(head)`` characters are a heading (the renderer shows them bold): a str,
    so it reads as the line it is."""

    head: str

    def __new__(cls, head: str, rest: str = '') -> Heading:
        line = super().__new__(cls, head + rest)
        line.head = head
        return line


@dataclass(frozen=True)
class Shown:
    """How ``info`` was asked to show its text: what a :meth:`Section.rows` may depend on besides its own fields.

    Attributes:
        now: the server time the state was read at (the clock every hold, window and rate is measured by).
        digests: show each identity's whole digest (``--digests``).
        width: cut job descriptions to this many characters (``--width``; 0: never).
    """

    now: float
    digests: bool = False
    width: int = 40


def text_only(default: object = None) -> Any:
    """A field of a :class:`Section` (or of a dataclass inside one) that its rows use but ``--json`` leaves out (a
    policy class whose words they are): ``policy: type[...] = text_only()``."""
    return field(default=default, compare=False, repr=False, metadata={'json': False})


def plain(value: object) -> object:
    """``value`` as JSON data: a dataclass as the dict of its fields (without :func:`text_only` ones), the items of a
    list, a tuple or a dict's values likewise (each keeps its type: a list field is a list in ``snapshot()``'s data
    and an array in ``--json``); anything else as it is."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in fields(value) if f.metadata.get('json', True)}
    if isinstance(value, list):
        return [plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(plain(item) for item in value)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    return value


class Section:
    """One policy's part of ``rq-policies info``, typed: a subclass is a dataclass whose fields are the value
    ``info --json`` shows for it (:meth:`as_json`, by field name), and which says its text from those same fields.

    The renderer (:mod:`rq_policies.surfaces.cli`) prints a queue's headline as the queue's name and every section's
    :meth:`headline` words, then each section's :meth:`rows`; ``info --json`` merges each queue section's
    :meth:`as_json` into the queue's entry (``queues.<name>``), and shows a cluster section's under
    ``policies.<name>``. So the two outputs cannot drift apart: there is one object, not a dict and a text written
    from it by hand.
    """

    def as_json(self) -> dict[str, object]:
        """The fields ``info --json`` shows (nested dataclasses as dicts, tuples as lists)."""
        found = plain(self)
        if not isinstance(found, dict):
            raise TypeError(f'{type(self).__name__}: a Section must be a dataclass')
        return found

    def headline(self) -> str:
        """The words this section adds to its queue's headline (``'cap 3, 1 in use'``); '' for none."""
        return ''

    def rows(self, shown: Shown) -> list[Row | str]:
        """The rows (:class:`Row`) and lines (a :class:`Heading`'s too) ``info`` prints for this section."""
        return []


@dataclass
class Metric:
    """One Prometheus metric family a policy exports (read from Redis at scrape time).

    Attributes:
        name: the family's name (a counter's without ``_total``: the exposition adds it).
        help: its HELP line.
        labels: its label names.
        kind: ``'gauge'`` or ``'counter'``.
        samples: (label values, value) per sample, in the order they are exposed.
    """

    name: str
    help: str
    labels: tuple[str, ...] = ()
    kind: Literal['gauge', 'counter'] = 'gauge'
    samples: list[tuple[tuple[str, ...], float]] = field(default_factory=list)

    def add(self, labels: Sequence[str], value: float) -> None:
        """Add a sample with these label values."""
        self.samples.append((tuple(labels), value))


@dataclass(frozen=True)
class Cell:
    """A dashboard cell that says more than its text (a plain str, int, float or None is a cell of its text).

    Attributes:
        text: what it shows.
        job: a job id the cell links to.
        at: a moment, in seconds from now (negative: past), shown after the text and a ``;`` as local ISO time and
            ``in 5 s`` / ``12 s ago`` (:func:`rq_policies.engine.readable.in_seconds`), with ``note`` before it.
        note: the words before ``at``'s moment (``'until'``).
        warn: highlighted (a key over its limit, a back-off).
        expired: greyed: a hold or marker past its time that no longer counts.
        title: shown on hover.
        sub: a second, small line (an identity's whole digest, to copy into a reset).
    """

    text: str = ''
    job: str | None = None
    at: float | None = None
    note: str = ''
    warn: bool = False
    expired: bool = False
    title: str = ''
    sub: str = ''


#: What a panel's row holds per column.
CellValue = Union[Cell, str, int, float, None]


@dataclass
class Panel:
    """One table a policy shows on the dashboard (:meth:`rq_policies.engine.policy.Policy.panels`), rendered by
    :mod:`rq_policies.surfaces.dashboard.data`.

    Its fields read as the keys of the dict a panel was before it was typed (``panel['rows']``), so code that read
    those reads these.

    Attributes:
        title: its heading.
        columns: its column names.
        rows: its rows, a value per column.
        note: a line under it (``'20 of 130 keys listed'``), '' for none.
    """

    title: str
    columns: list[str]
    rows: list[list[CellValue]]
    note: str = ''

    def __getitem__(self, name: str) -> object:
        if name not in ('title', 'columns', 'rows', 'note'):
            raise KeyError(name)
        return getattr(self, name)


@dataclass
class Explanation:
    """A policy's verdict on one job, its part of ``rq-policies explain``
    (:meth:`rq_policies.engine.policy.Policy.explain`), rendered by :mod:`rq_policies.surfaces.explainer` (the text
    lines, ``--json``, the dashboard's job page).

    Attributes:
        policy: the policy's name.
        verdict: what it says of the job now, in words.
        change: what would change that ('' for nothing to do).
        details: its own fields (``--json`` shows them beside ``policy``, ``verdict`` and ``change``; the page lists
            them in this order).
    """

    policy: str
    verdict: str
    change: str = ''
    details: dict[str, object] = field(default_factory=dict)

    def as_dict(self) -> dict[str, object]:
        """The entry ``explain``'s answer lists: ``{'policy', ...details, 'verdict', 'change'}``."""
        return {'policy': self.policy, **self.details, 'verdict': self.verdict, 'change': self.change}
