"""What a policy shows, apart from its rules: its views (:class:`PolicyViews`, a subclass in the policy's
``views.py`` naming the policy) and the descriptions they return, which one generic renderer per surface renders:
``rq_policies.surfaces.cli`` (commands: :class:`Setting`, :class:`Command`, :class:`Group`, with :class:`Argument`,
:class:`Option`, :class:`Digits`, a :class:`Reply`, refusals :class:`BadArgument`/:class:`UsageError`; and ``info``'s
:class:`Section` per queue or per policy, whose fields are its ``--json`` and whose :meth:`~Section.headline` and
:meth:`~Section.rows` its text), ``rq_policies.surfaces.metrics`` (:class:`Metric`), ``rq_policies.surfaces.dashboard``
(:class:`Panel` of :class:`Cell`) and ``rq_policies.surfaces.explainer`` (:class:`Explanation`).

A policy's modules never import click, Flask or prometheus_client (``tests/engine/test_architecture.py``): the
renderers own the presentation, the descriptions the words, so an output stays what it was when its renderer changes.
docs/architecture.md, "Rules and views apart".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Union

from . import reading
from .policy import load_views, registered
from .readable import WIDTH, identity, in_seconds

if TYPE_CHECKING:
    from redis import Redis

    from .keyed import KeyedPolicy
    from .keys import Family
    from .policy import Policy

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


#: What :meth:`PolicyViews.commands` returns items of.
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
    """One table a policy shows on the dashboard (:meth:`PolicyViews.panels`), rendered by
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
    (:meth:`PolicyViews.explain`), rendered by :mod:`rq_policies.surfaces.explainer` (the text
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


def identity_cell(row: dict[str, Any], width: int = WIDTH) -> Cell:
    """A page cell of an identity: its job's description, and the whole digest under it in small type (selectable,
    for a reset)."""
    return Cell(identity(row, width), sub=row['digest'], title=row.get('job_description') or '')


def pending_lines(family: Family, block: dict[str, Any], detail: Callable[[dict[str, Any]], str],
                  digests: bool = False, width: int = WIDTH) -> list[Row]:
    """``info``'s lines for a family of pending jobs (a trailing Throttle's, a Debounce's): a count, then one line per
    identity (its job's description, :func:`rq_policies.engine.readable.identity`) with ``detail(row)`` and when it runs
    (the key expires at the job's run time)."""
    items = []
    for row in block['entries']:
        runs = f'  runs {in_seconds(row["expires_in"])}' if row['expires_in'] is not None else ''
        extra = detail(row)
        items.append(f'{identity(row, width, digests)}{"  " + extra if extra else ""}{runs}')
    return [Row(family.name, f'{block["count"]} pending', tuple(items))]


# -- a policy's views: what it shows, apart from its rules ----------------------------------------------------------

_VIEWS: dict[str, type[PolicyViews]] = {}


class PolicyViews:
    """What one policy shows: its part of ``explain``, ``info``, the dashboard, the metrics and the CLI. A subclass
    names its policy (``policy = Loner``) and is registered under the policy's name when it is defined: imported with
    the policy's rules, or at the first look at the views (:func:`rq_policies.engine.policy.defer_views`: the
    built-in policies' are). Each method defaults to showing
    nothing, so a policy's views define only what it has to show; a surface finds them through :func:`shown` and
    :func:`views_of`, never by importing a policy's module."""

    #: The policy these views show (its class), and its name.
    policy: ClassVar[type[Policy]]
    name: ClassVar[str]
    #: The settings its ``set(queue, ..., connection=)`` takes per queue (a cap, a rate), in the order the dashboard's
    #: settings form offers them (with ``clear(queue, connection=)``); () for none.
    queue_settings: ClassVar[tuple[str, ...]] = ()
    #: Its run-time setting is one limit per key (``set``/``get``/``clear(scope, key, ...)``): the override form.
    key_limit_setting: ClassVar[bool] = False
    #: Its run-time switch pauses one key (``pause``/``resume``/``pause_status(scope, key, connection=)``).
    key_pause_setting: ClassVar[bool] = False
    #: Its run-time setting is one weight per key (``set(scope, key, weight)``, ``get`` with ``.weight``, ``clear``).
    key_weight_setting: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if 'policy' in cls.__dict__:
            cls.name = cls.policy.name
            _VIEWS[cls.name] = cls

    @classmethod
    def explain(cls, connection: Redis, job: dict[str, str], now: float) -> list[Explanation]:
        """Its part of ``rq-policies explain`` for one job (:func:`rq_policies.surfaces.explainer.explain`): ``job``
        is the job hash without its payload (str -> str, the policies' own ``policies_*`` fields, ``id`` and ``now``,
        the server clock). Answer from Redis alone, building keys from what the job hash stores (never SCAN); empty
        when it has nothing to say about the job."""
        return []

    @classmethod
    def explain_gone(cls, connection: Redis, job_id: str, records: dict[str, Any], now: float) -> list[Explanation]:
        """Its part of ``explain`` for a job id with no job hash, from what the admission left about that id:
        ``records`` holds ``superseded`` (the tombstone, ``{'policy', 'by', 'merged'}``), ``dropped`` (the drop
        record of an enqueue given ``job_id=``: ``{'policy', 'holder', 'n', 'at', 'queue'}``), each None when absent,
        and ``job_prefix``. Empty when the records are not its own."""
        return []

    @classmethod
    def describe(cls, family: Family, block: dict[str, Any], digests: bool = False,
                 width: int = WIDTH) -> list[Row | str]:
        """The rows ``info`` prints for one of its identity families on one queue (``block`` is what ``info --json``
        shows for it: ``count``, the listed ``entries``, and ``server_time``); an identity is shown as its job's
        description (:func:`rq_policies.engine.readable.identity`), with the whole digest when ``digests``."""
        return [Row(family.name, f'{block["count"]} key(s)',
                    tuple(identity(row, width, digests) for row in block['entries']))]

    @classmethod
    def queue_info(cls, connection: Redis, names: list[str], now: float, limit: int | None) -> dict[str, Section]:
        """Per queue name, its part of that queue in ``info``: a :class:`Section` whose fields join the queue's
        ``--json`` entry and whose ``headline`` and ``rows`` are its text (``limit`` bounds the entries listed,
        None: all). A name left out: nothing for that queue."""
        return {}

    @classmethod
    def check_setting(cls, settings: dict[str, int]) -> None:
        """Refuse, as its ``set`` would and without writing anything, values of its run-time setting it would refuse
        (``ValueError`` or ``TypeError`` naming the setting): a queue's ``queue_settings``, a key's ``weight``. The
        dashboard's forms check them before their confirmation page. Nothing to check by default."""

    @classmethod
    def cluster_info(cls, connection: Redis, now: float, limit: int | None) -> Section | None:
        """Its state that belongs to no queue (a per-key limit's keys), for ``info``: a :class:`Section` whose
        fields are ``info --json``'s ``policies.<name>``; ``limit`` bounds the entries listed (None: all)."""
        return None

    @classmethod
    def panels(cls, connection: Redis, now: float, limit: int, search: str | None = None) -> list[Panel]:
        """Its panels on the dashboard, read in a bounded number of commands (SCAN with COUNT and a budget, never
        KEYS; at most ``limit`` rows a panel, ``note`` saying when there are more), about ``search`` (a queue name,
        a key, a digest or a job id) when given. The page escapes every cell."""
        return []

    @classmethod
    def metrics(cls, connection: Redis, now: float) -> list[Metric]:
        """Its Prometheus families, read from Redis at scrape time (``now``: the server clock)."""
        return []

    @classmethod
    def commands(cls) -> tuple[View, ...]:
        """The subcommands it adds to ``rq-policies``."""
        return ()


def shown(kind: str | None = None) -> list[type[PolicyViews]]:
    """The views of every registered policy (of one kind) that has views, in the registry's order (the deferred
    ones imported first: :func:`rq_policies.engine.policy.load_views`)."""
    load_views()
    return [_VIEWS[cls.name] for cls in registered(kind) if cls.name in _VIEWS]


def views_of(name: str) -> type[PolicyViews]:
    """The views of policy ``name`` (the base, which shows nothing, for a policy that has none)."""
    load_views()
    return _VIEWS.get(name, PolicyViews)


def superseded_entry(policy: str, connection: Redis, records: dict[str, Any], pending: str,
                     change: str) -> list[Explanation]:
    """The ``explain_gone`` entry of a pending job that a later enqueue of ``policy`` replaced (its tombstone in
    ``records['superseded']``), or [] when no tombstone of ``policy`` names one. ``pending`` says what the job was (a
    debounced, a trailing job) and when its replacement runs; ``change`` is the advice, ``{by}`` the job that runs.

    The chain of replacements is followed to the job that will run (``runs_as``, with ``chain`` from the first
    replacement): ids superseded one by another before pending jobs were rewritten in place each name the next. An
    id whose enqueue was merged into the pending job in place (its tombstone says ``merged``: that call's job was
    never written) names the pending job its payload went into."""
    superseded = records['superseded']
    if not superseded or superseded['policy'] != policy:
        return []
    by = superseded['by']
    chain, status, queue = reading.follow(connection, records['job_prefix'], by)
    final = chain[-1]
    via = f' (via {", ".join(chain[:-1])}, each replaced in turn)' if len(chain) > 1 else ''
    if superseded.get('merged'):
        verdict = (f'merged into pending job {final} ({status or "gone"} now){via}: this enqueue\'s payload was '
                   f'written into that job in place (its own id was never a job)')
    else:
        verdict = f'superseded by job {by} ({status or "gone"} now): {pending}, which was deleted'
        if final != by:
            verdict = (f'superseded by job {by}, itself replaced: the job that runs is {final} '
                       f'({status or "gone"} now){via}: {pending}, which was deleted')
    return [Explanation(policy, verdict, change.format(by=final), {
        'superseded_by': by, 'runs_as': final, 'chain': chain, 'queue': queue, 'merged': bool(superseded.get('merged')),
    })]


# -- the per-key policies' views (Concurrency, Rate) ----------------------------------------------------------------


@dataclass(frozen=True)
class KeyScope:
    """One scope of a per-key policy in ``rq-policies info``: its keys with state, the jobs of them in use and
    parked, and the busiest keys (:meth:`KeyedViews.key_rows`'s rows, at most ``--limit``)."""

    keys: int
    in_use: int
    parked: int
    busiest: list[dict[str, Any]]


@dataclass(frozen=True)
class KeyedState(Section):
    """A per-key policy's part of ``rq-policies info`` (``policies.<name>`` in ``--json``: ``scopes`` and ``now``,
    the server time its rows were read at): a heading per scope, then its busiest keys' lines
    (:meth:`KeyedViews.key_lines`)."""

    scopes: dict[str, KeyScope]
    now: float
    policy: type[KeyedViews] = text_only()

    def rows(self, shown: Shown) -> list[Row | str]:
        lines: list[Row | str] = []
        for scope, entry in self.scopes.items():
            lines.append(Heading(f'{self.policy.policy.__name__} per key, scope {scope}',
                                 f'  ({entry.keys} key(s), {entry.in_use} in use, {entry.parked} parked)'))
            lines += ['  ' + line for line in self.policy.key_lines(entry.busiest, self.now)]
            if entry.keys > len(entry.busiest):
                lines.append(f'  ... and {entry.keys - len(entry.busiest)} more (rq-policies keys {scope})')
        return lines


class KeyedViews(PolicyViews):
    """What the per-key policies show alike: per scope its busiest keys (``info``, ``rq-policies keys``) and a
    panel per scope from one bounded SCAN; a policy says its keys' rows, their words and its panel's columns."""

    policy: ClassVar[type[KeyedPolicy]]
    #: The columns of its panel of a scope (one row per key: :meth:`panel_row`).
    columns: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def key_rows(cls, connection: Redis, scope: str, limit: int = 20, search: str | None = None,
                 now: float | None = None, names: list[str] | None = None) -> list[dict[str, Any]]:
        """The keys of ``scope`` it has state for, busiest first, at most ``limit`` (0: all): found by SCAN (MATCH,
        COUNT), never KEYS, unless ``names`` gives the keys to read (``rq-policies keys``, ``info``, the page)."""
        raise NotImplementedError

    @classmethod
    def key_lines(cls, rows: list[dict[str, Any]], now: float) -> list[str]:
        """``rq-policies keys``'s lines for :meth:`key_rows`."""
        raise NotImplementedError

    @classmethod
    def panel_row(cls, row: dict[str, Any], now: float) -> list[CellValue]:
        """Its panel's row for one of :meth:`key_rows`'s rows."""
        raise NotImplementedError

    @classmethod
    def cluster_info(cls, connection: Redis, now: float, limit: int | None) -> Section | None:
        """Per scope with state: how many keys, in use, parked, and the busiest keys (at most ``limit``)."""
        out = {}
        for scope in sorted(reading.scopes(connection, cls.name, holds=cls.policy.holds)):
            rows = cls.key_rows(connection, scope, 0, None, now)
            if rows:
                out[scope] = KeyScope(len(rows), sum(r.get('in_use', 0) for r in rows), sum(r['parked'] for r in rows),
                                      rows[:limit] if limit else rows)
        return KeyedState(out, now, cls) if out else None

    @classmethod
    def panels(cls, connection: Redis, now: float, limit: int, search: str | None = None) -> list[Panel]:
        """The busiest keys of each scope, from one bounded SCAN walk (:func:`rq_policies.engine.reading.sample_keys`):
        at most ``PANEL_BUDGET`` keys examined and ``PANEL_KEYS`` keys read per scope, with a note when the walk
        stopped early (``rq-policies keys SCOPE --limit 0`` reads them all)."""
        found, complete = reading.sample_keys(connection, cls.name, holds=cls.policy.holds)
        out = []
        for scope in sorted(found):
            names, note = reading.panel_names(found[scope], search, complete)
            rows = cls.key_rows(connection, scope, limit, search, now, names=names)
            if rows:
                out.append(Panel(f'{cls.policy.__name__} per key: {scope}', list(cls.columns),
                                 [cls.panel_row(row, now) for row in rows], note or ''))
        return out


def keyed_views() -> list[type[KeyedViews]]:
    """The views of the registered per-key policies, in the registry's order."""
    return [found for found in shown() if issubclass(found, KeyedViews)]
