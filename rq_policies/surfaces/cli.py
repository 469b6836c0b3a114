"""The ``rq-policies`` command: inspect and change policy state from a shell.

It takes the same connection options and environment variables as ``rq`` (``--url``/``RQ_REDIS_URL``,
``--config``/``RQ_CONFIG`` with ``REDIS_URL``, ``REDIS_HOST``... or a ``SENTINEL`` dict, and the ``REDIS_*``
variables when neither is given), because it reuses rq's own option set and connection helper
(``rq.cli.helpers.shared_options`` and ``CliConfig``). They are taken before the subcommand
(``rq-policies --url URL info``) as well as after it (``rq-policies info --url URL``, as ``rq`` takes them); given in
both places, the one after the subcommand wins.

Every error is one line on stderr and a non-zero exit (2 for bad usage, 1 for anything else), never a traceback. A
negative number where a number is expected (``cap billing -3``) is refused by the argument's type, naming the argument
and the value, not taken for an unknown option.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import signal
import sys
import threading
from functools import update_wrapper
from typing import Any

import click
from click.core import ParameterSource
from redis.exceptions import RedisError
from rq.cli.helpers import CliConfig, shared_options
from rq.utils import import_attribute

from rq_policies.engine import __version__, compat, health, identity, keys, reading, views
from rq_policies.engine.exceptions import PolicyConfigurationError
from rq_policies.engine.policy import declared

from . import replicas, state


class CommandError(click.ClickException):
    """A one-line error the command reports (exit status 1)."""


#: ``--read-from-replicas``, on the commands that only read (info, explain, exporter, dashboard).
READ_FROM_REPLICAS = click.option(
    '--read-from-replicas', 'read_from_replicas', is_flag=True,
    help='On a cluster (--connection-class redis.cluster.RedisCluster), read from the replicas of the prefix\'s slot: '
         'what is shown may be a moment behind the primary (the replication lag); writes and scripts still go to '
         'the primary.')


def _connect(cli_config: Any, read_from_replicas: bool = False, keep: bool = False) -> Any:
    """The command's client; with ``read_from_replicas``, the replica reader of it
    (:mod:`rq_policies.surfaces.replicas`), refused in one line naming ``--read-from-replicas`` on anything but a
    cluster (before anything is read). ``keep``: check the option but return the connection itself (the dashboard builds
    its reader for its pages only)."""
    try:
        conn = cli_config.connection
        if read_from_replicas:
            replicas.check(conn, '--read-from-replicas')
        # `--connection-class redis.cluster.RedisCluster` (rq's own option) reaches a cluster: refused without a
        # hash-tagged RQ_KEY_PREFIX, else adopted as PolicyQueue does (docs/cluster.md)
        keys.check_connection(conn)
        compat.adopt_cluster(conn)
        conn.ping()
        if read_from_replicas and not keep:
            reader = replicas.replica_reader(conn, '--read-from-replicas')
            if replicas.owned(reader, conn):
                conn.close()  # the command reads through the reader only
            conn = reader
    except RedisError as exc:
        at = _address(cli_config)
        raise CommandError(f'cannot reach Redis{" at " + at if at else ""} '
                           f'({getattr(cli_config, "source", None) or _source(cli_config)}): {exc}') from None
    except PolicyConfigurationError as exc:
        raise CommandError(str(exc)) from None
    except (ImportError, ValueError) as exc:  # a bad --config module, a malformed URL
        raise CommandError(f'cannot connect to Redis: {exc}') from None
    return conn


def _address(cli_config: Any) -> str | None:
    """Where the client connects (``host:port/db`` or a socket path), without a password; None when unknown (a
    cluster, a Sentinel)."""
    connection = getattr(cli_config, '_connection', None)
    pool = getattr(connection, 'connection_pool', None)
    found = getattr(pool, 'connection_kwargs', None) or {}
    if found.get('path'):
        return str(found['path'])
    if found.get('host'):
        return f'{found["host"]}:{found.get("port", 6379)}/{found.get("db", 0)}'
    return None


def _source(cli_config: Any, url_from: str = '--url') -> str:
    """Which setting chose the server, as the error of an unreachable one names it (rq's order: ``--url``, then
    ``--config``, then the ``REDIS_*`` variables of the environment)."""
    if cli_config.url:
        return f'from {url_from}'
    if cli_config.config:
        return f'from --config {cli_config.config}'
    if os.environ.get('REDIS_URL') is not None:
        return 'from REDIS_URL; --url or RQ_REDIS_URL chooses another'
    if any(os.environ.get(name) for name in ('REDIS_HOST', 'REDIS_PORT', 'REDIS_DB')):
        return 'from the REDIS_HOST/REDIS_PORT/REDIS_DB variables; --url or RQ_REDIS_URL chooses another'
    return 'no --url, RQ_REDIS_URL, --config or REDIS_URL given: pass --url redis://HOST:PORT/DB'


def _shared_names() -> tuple[str, ...]:
    def probe() -> None:
        pass

    for option in shared_options:
        option(probe)
    return tuple(param.name for param in probe.__click_params__)  # type: ignore[attr-defined]


#: rq's connection options' parameter names (url, config, path, ...), which the group takes too.
_SHARED = _shared_names()


def pass_cli_config(func: Any) -> Any:
    """rq's ``pass_cli_config`` (its connection options on the command, a ``CliConfig`` passed first), with the
    options given before the subcommand (kept by :func:`main`) used where the command's own were not given."""
    for option in shared_options:
        func = option(func)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        before = ctx.find_root().meta.get('rq_policies.connection', {})
        url_from = '--url'
        for name, value in before.items():
            if ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.PROMPT):
                continue  # after the subcommand wins
            kwargs[name] = value
        if ctx.get_parameter_source('url') is ParameterSource.ENVIRONMENT and 'url' not in before:
            url_from = 'RQ_REDIS_URL'
        cli_config = CliConfig(**kwargs)
        cli_config.source = _source(cli_config, url_from)
        return ctx.invoke(func, cli_config, *args[1:], **kwargs)

    return update_wrapper(wrapper, func)


#: A token that is a negative number (``-3``, ``-0.5``, ``-3/60s``), never an option of ours.
_NEGATIVE = re.compile(r'-\.?[0-9]')


class Command(click.Command):
    """Every command of ``rq-policies``: a negative number (``cap billing -3``) reaches the argument or option it is
    the value of, so that its type refuses it naming the argument and the value, instead of click's ``No such option:
    -3``. Any other unknown option is still refused by click."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        negative, unknown, names = _scan(self, ctx, args)
        if negative and unknown is not None:  # click would name the number: name the option instead
            raise click.NoSuchOption(unknown, possibilities=difflib.get_close_matches(unknown, names), ctx=ctx)
        if negative:
            ctx.ignore_unknown_options = True
        return super().parse_args(ctx, args)


def _scan(command: click.Command, ctx: click.Context, args: list[str]) -> tuple[bool, str | None, list[str]]:
    """Whether ``args`` hold a negative number, the first other token click would take for an unknown option (None
    if none), and the command's option names."""
    takes_value, flags = set(), set()
    for param in command.get_params(ctx):
        if isinstance(param, click.Option):
            names = [*param.opts, *param.secondary_opts]
            (flags if param.is_flag or param.count else takes_value).update(names)
    negative, unknown, skip = False, None, False
    for token in args:
        if skip:
            skip = False
            continue
        if token == '--':
            break
        if token in takes_value:
            skip = True
        elif _NEGATIVE.match(token):
            negative = True
        elif (unknown is None and token.startswith('-') and len(token) > 1 and token not in flags
              and token.split('=', 1)[0] not in takes_value):
            unknown = token
    return negative, unknown, sorted(takes_value | flags)


#: What a refusal of an unknown queue suggests, per command: only options the command has (a test walks them).
_UNKNOWN_QUEUE_HINTS = {
    'cap': 'pass --force to cap it anyway',
    'rate': 'pass --force to limit it anyway',
    'info': 'check the name; rq-policies info with no QUEUE lists every queue with policy state',
    'reset': 'check the name; rq-policies info lists the queues with policy state',
}


def _require_known(conn: Any, queue: str, force: bool = False, command: str = 'cap') -> None:
    """Refuse a queue nothing has seen (rq, a policy setting, a live worker), with a hint the command can follow."""
    if force or reading.known_queue(conn, queue):
        return
    hint = _UNKNOWN_QUEUE_HINTS.get(command)
    raise CommandError(
        f'unknown queue {queue!r}: rq has no such queue, no policy setting names it and no worker listens to it'
        + (f' ({hint})' if hint else '')
    )


class Digits(click.ParamType):
    """Every integer argument of the command: plain ASCII decimal digits in ``[minimum, maximum]``
    (:class:`rq_policies.engine.views.Digits` as a click type).

    A refusal names the argument (click's ``Invalid value for 'N'``), the value as typed and what is wrong with it,
    and comes before the command connects, so nothing in Redis changes.

    Args:
        what: how the message names a valid value (``a positive integer up to 2147483647``).
        minimum: the smallest value accepted.
        maximum: the largest value accepted, None for no bound.
    """

    name = 'integer'

    def __init__(self, what: str, minimum: int = 0, maximum: int | None = None) -> None:
        self.spec = views.Digits(what, minimum, maximum)

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            return self.spec.parse(value)
        except views.BadArgument as exc:
            self.fail(exc.message, param, ctx)


def _parse_value(text: str) -> Any:
    """An ARG as a JSON literal when it is one (``3``, ``true``, ``null``, ``"3"``, ``[1, 2]``), else as a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _group_options(func: Any) -> Any:
    for option in shared_options:
        func = option(func)
    return func


@click.group()
@click.version_option(__version__, prog_name='rq-policies')
@_group_options
@click.pass_context
def main(ctx: click.Context, **options: Any) -> None:
    """Inspect and change rq-policies state: caps, holds, identities, limited-capacity workers, metrics.

    rq's connection options (--url, --config, ...) go before the COMMAND or after it; after it, they win.
    """
    ctx.meta['rq_policies.connection'] = {
        name: value for name, value in options.items()
        if name in _SHARED and ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE
    }


# -- info -----------------------------------------------------------------------------------------------------------


@main.command(cls=Command)
@click.argument('queues', nargs=-1)
@click.option('--json', 'as_json', is_flag=True, help='Print the state as JSON (for scripts).')
@click.option('--limit', type=Digits('an integer >= 0'), default=20, show_default=True,
              help='Entries listed per queue and kind (0: all).')
@click.option('--digests', is_flag=True, help='Show each identity\'s whole digest beside its job (for reset).')
@click.option('--width', type=Digits('an integer >= 0'), default=40, show_default=True,
              help='Cut job descriptions to this many characters (0: never).')
@READ_FROM_REPLICAS
@pass_cli_config
def info(cli_config: Any, queues: tuple[str, ...], as_json: bool, limit: int, digests: bool, width: int,
         read_from_replicas: bool, **options: Any) -> None:
    """Show caps, live holds, loner markers, throttle windows, pending trailing and debounced jobs per queue,
    per-key state and limited-capacity workers with their gauges; with QUEUES, only those queues.

    Times are local ISO time with how far they are from now; an identity is shown as its holder job's description
    (the digest with --digests, and always in --json).
    """
    conn = _connect(cli_config, read_from_replicas)
    for name in queues:
        _require_known(conn, name, command='info')
    found = state.survey(conn, list(queues) if queues else None, limit=limit or None)
    if queues:  # only these queues: no per-key scopes (they span queues), only their limited-capacity workers
        found.policies = {}
        found.workers = state.WorkerGauges([row for row in found.workers.limited_capacity_workers
                                            if row.get('queue') in queues])
    check = health.eviction_check(conn)
    if as_json:
        snap = found.as_json()
        snap['server'] = {'maxmemory_policy': check.maxmemory_policy, 'eviction_unsafe': check.unsafe,
                          'evicted_keys': check.evicted_keys, 'warning': check.warning}
        click.echo(json.dumps(snap, indent=2, sort_keys=True))
        return
    if check.warning:
        click.echo(click.style('warning: ', fg='yellow', bold=True) + check.warning)
    _print_info(found, digests=digests, width=width)


def _short(digest: str) -> str:
    return digest[:12]


def _echo_rows(rows: list[Any]) -> None:
    """``info``'s rows of state (:class:`~rq_policies.engine.views.Row`: the label in a column of 9, the entries
    indented under it) and lines (a :class:`~rq_policies.engine.views.Heading` bold)."""
    for row in rows:
        if isinstance(row, views.Row):
            click.echo(f'  {row.label:<9} {row.text}')
            for item in row.items:
                click.echo(f'    {item}')
        else:
            click.echo(_styled(row))


def _print_info(found: state.Survey, digests: bool = False, width: int = 40) -> None:
    """``info``'s text, rendered from the same :class:`~rq_policies.surfaces.state.Survey` its ``--json`` is the data
    of: per queue a bold head with its sections' headline words, then every section's rows; then the sections that
    belong to no queue."""
    if not found.queues:
        click.echo('No queue has a cap, a hold or policy state.')
    shown = views.Shown(found.server_time, digests, width)
    for name, sections in found.queues.items():
        head = click.style(f'queue {name}', bold=True)
        words = state.headline(sections)
        click.echo(f'{head}  ({", ".join(words)})' if words else head)
        for section in sections:
            _echo_rows(_family_rows(section, shown) if isinstance(section, state.IdentityFamily)
                       else section.rows(shown))
    for section in [*found.policies.values(), found.workers]:
        _echo_rows(section.rows(shown))


def _family_rows(found: state.IdentityFamily, shown: views.Shown) -> list[Any]:
    """An identity family's rows: its policy's words (its views' ``describe``), then how many more are not listed."""
    if not found.count:
        return []
    block = {**found.as_json()[found.family.name], 'server_time': shown.now}
    rows = list(views.views_of(found.family.policy).describe(found.family, block, digests=shown.digests,
                                                                width=shown.width))
    if found.count > len(found.entries):
        rows.append(f'    ... and {found.count - len(found.entries)} more (--limit 0 lists all)')
    return rows


# -- reset ----------------------------------------------------------------------------------------------------------


def _click_type(kind: Any) -> Any:
    return Digits(kind.what, kind.minimum, kind.maximum) if isinstance(kind, views.Digits) else kind


def _click_option(option: views.Option) -> Any:
    """A described option (:class:`rq_policies.engine.views.Option`) as click's decorator."""
    extra = {'is_flag': True} if option.is_flag else {'default': option.default}
    if option.kind is not None:
        extra['type'] = _click_type(option.kind)
    return click.option(option.flag, option.dest, help=option.help, **extra)


#: Every command that writes a setting (or resets an identity) can wait for replicas to have the write
#: (:func:`rq_policies.surfaces.replicas.wait_for_replicas`): "set" then means "on N replicas too", so a failover right
#: after does not bring the old value back.
_WAIT_OPTIONS = (
    views.Option('--wait-replicas', 'wait_replicas',
                 "After the write, wait until N replicas have it (WAIT, on a cluster the prefix slot's primary's); "
                 'fewer within --wait-timeout: exit 1, naming how many did (the write stays).',
                 kind=views.Digits('a positive integer', 1)),
    views.Option('--wait-timeout', 'wait_timeout', 'The most milliseconds --wait-replicas waits (default 1000).',
                 default=1000, kind=views.Digits('a positive integer of milliseconds', 1, 2**31 - 1)),
)


def _wait_replicas(conn: Any, values: dict[str, Any]) -> None:
    """After a write: ``--wait-replicas`` (when given) waits, and says on stderr how many replicas have it."""
    wanted = values.get('wait_replicas')
    if wanted is None:
        return
    timeout = values.get('wait_timeout') or _WAIT_OPTIONS[1].default
    got = replicas.wait_for_replicas(conn, wanted, timeout)
    if got < wanted:
        raise CommandError(f'written, but {got} of {wanted} replica(s) had it within {timeout} ms '
                           '(--wait-replicas): a failover now could bring the old value back')
    click.echo(f'On {got} replica(s).', err=True)


@main.command(cls=Command)
@click.argument('queue')
@click.argument('function')
@click.argument('args', nargs=-1)
@click.option('--kwarg', 'kwargs', multiple=True, metavar='KEY=VALUE', help='A keyword argument (parsed as ARGS).')
@_click_option(_WAIT_OPTIONS[0])
@_click_option(_WAIT_OPTIONS[1])
@pass_cli_config
def reset(cli_config: Any, queue: str, function: str, args: tuple[str, ...], kwargs: tuple[str, ...],
          wait_replicas: int | None, wait_timeout: int, **options: Any) -> None:
    """Clear one identity's state on QUEUE: loner marker, throttle slots, pending trailing and debounce state.

    FUNCTION is the job function's import path; ARGS are its positional arguments, each read as a JSON literal
    when it is one (3, 2.5, true, null, "3", [1, 2], {"a": 1}) and as a string otherwise. When FUNCTION can be
    imported (see --path), its declared unique_context applies, as it does on enqueue.
    """
    call_args = [_parse_value(arg) for arg in args]
    call_kwargs: dict[str, Any] = {}
    for item in kwargs:
        key, sep, value = item.partition('=')
        if not sep or not key:
            raise click.BadParameter(f'expected KEY=VALUE, got {item!r}', param_hint='--kwarg')
        call_kwargs[key] = _parse_value(value)
    func_name, unique_context, spec = _resolve(function)
    conn = _connect(cli_config)
    _require_known(conn, queue, command='reset')
    try:
        result = state.reset_identity(conn, queue, func_name, call_args, call_kwargs, unique_context, spec)
    except TypeError as exc:
        raise CommandError(str(exc)) from None
    removed = result['removed']
    click.echo(f'Identity {_short(result["digest"])} of {func_name} on {queue!r}: '
               + (f'removed {removed} key(s)' if removed else 'nothing to clear')
               + ' (loner marker, throttle slots, pending trailing and debounced jobs; queued jobs are left alone).')
    _wait_replicas(conn, {'wait_replicas': wait_replicas, 'wait_timeout': wait_timeout})


def _resolve(function: str) -> tuple[str, Any, Any]:
    """The function's name as rq stores it, its unique_context and declared PolicySet, importing it when possible."""
    if not function or function.startswith('.') or function.endswith('.') or '.' not in function:
        raise click.BadParameter(f'expected an import path like app.tasks.sync, got {function!r}',
                                 param_hint='FUNCTION')
    try:
        func = import_attribute(function)
    except (ImportError, AttributeError, ValueError):
        click.echo(f'note: cannot import {function}; its arguments are used as given (no unique_context)', err=True)
        return function, None, None
    spec = declared(func)
    name = identity.function_name(func) if hasattr(func, '__qualname__') else function
    return name, spec.unique_context if spec else None, spec


# -- explain --------------------------------------------------------------------------------------------------------


@main.command(cls=Command)
@click.argument('job_id')
@click.option('--json', 'as_json', is_flag=True, help='Print the answer as JSON (for tools).')
@READ_FROM_REPLICAS
@pass_cli_config
def explain(cli_config: Any, job_id: str, as_json: bool, read_from_replicas: bool, **options: Any) -> None:
    """Why is JOB_ID where it is: its status and queue, and each policy's verdict on it now (from Redis alone)."""
    from . import explainer as explaining

    conn = _connect(cli_config, read_from_replicas)
    try:
        answer = explaining.explain(job_id, connection=conn)
    except (explaining.UnknownJob, ValueError) as exc:
        raise CommandError(str(exc)) from None
    if as_json:
        click.echo(json.dumps(answer, indent=2, sort_keys=True))
        return
    for line in explaining.lines(answer):
        click.echo(line)


# -- exporter -------------------------------------------------------------------------------------------------------


@main.command(cls=Command)
@click.option('--port', type=Digits('a port number from 1 to 65535', 1, 65535), default=9121, show_default=True,
              help='Port to serve on.')
@click.option('--addr', default='0.0.0.0', show_default=True, help='Address to bind.')
@READ_FROM_REPLICAS
@pass_cli_config
def exporter(cli_config: Any, port: int, addr: str, read_from_replicas: bool, **options: Any) -> None:
    """Serve Prometheus metrics of every policy at http://ADDR:PORT/metrics until stopped."""
    try:
        from .metrics import make_server
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    conn = _connect(cli_config, read_from_replicas)  # the scrapes read through the replica reader
    try:
        server = make_server(conn, port, addr)
    except OSError as exc:
        raise CommandError(f'cannot serve on {addr}:{port}: {exc.strerror or exc}') from None
    _serve(server, 'exporter', f'Serving rq-policies metrics on http://{addr}:{port}/metrics')


def _serve(server: Any, name: str, banner: str, close: Any = None) -> None:
    """Serve until SIGTERM or SIGINT, then close the server (and ``close()`` what it leaves)."""

    def stop(signum: int, frame: Any) -> None:
        # Raising here would be wrong: the signal can land while wsgiref is inside a request, and its handler
        # catches everything (KeyboardInterrupt included), prints it, and serves on. shutdown() must come from
        # another thread than serve_forever's; the loop then ends within its 0.5 s poll.
        threading.Thread(target=server.shutdown, name=f'{name}-stop', daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    click.echo(banner, err=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        if close is not None:
            close()


# -- dashboard ------------------------------------------------------------------------------------------------------


@main.command(cls=Command)
@click.option('--port', type=Digits('a port number from 1 to 65535', 1, 65535), default=9181, show_default=True,
              help='Port to serve on.')
@click.option('--host', default='127.0.0.1', show_default=True,
              help='Address to bind (the page shows job ids and queue names: keep it local unless behind auth).')
@click.option('--allow-actions', is_flag=True,
              help='Offer actions (set or clear a cap or a rate, reset an identity, override a key limit, pause or '
                   'resume a key), each '
                   'behind a confirmation. Off: the page is read-only.')
@click.option('--refresh', type=Digits('a whole number of seconds >= 0'), default=2, show_default=True,
              help='Seconds between live refreshes of the page (0: never).')
@READ_FROM_REPLICAS
@pass_cli_config
def dashboard(cli_config: Any, port: int, host: str, allow_actions: bool, refresh: int, read_from_replicas: bool,
              **options: Any) -> None:
    """Serve a web page of policy state at http://HOST:PORT/ until stopped (needs rq-policies[dashboard]).

    With --read-from-replicas the pages read a cluster's replicas; the actions (--allow-actions) still use the
    primary."""
    try:
        from .dashboard.serve import server
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    conn = _connect(cli_config, read_from_replicas, keep=True)
    try:
        served, close = server(conn, host, port, allow_actions=allow_actions, refresh_seconds=refresh,
                               read_from_replicas=read_from_replicas)
    except OSError as exc:
        raise CommandError(f'cannot serve on {host}:{port}: {exc.strerror or exc}') from None
    mode = 'actions on' if allow_actions else 'read-only'
    _serve(served, 'dashboard', f'Serving the rq-policies dashboard ({mode}) on http://{host}:{served.server_port}/',
           close)


# -- entry point ----------------------------------------------------------------------------------------------------


# -- the policies' own commands, rendered from what each describes (rq_policies.engine.views)
# ------------------------------


def _echo(reply: views.Reply) -> None:
    if reply.data is not None:
        click.echo(json.dumps(reply.data, indent=2, sort_keys=True))
        return
    for line in reply.lines:
        click.echo(_styled(line))


def _styled(line: str) -> str:
    """A line of a policy's, with its :class:`~rq_policies.engine.views.Heading` bold."""
    if isinstance(line, views.Heading):
        return click.style(line.head, bold=True) + line[len(line.head):]
    return line


def _refusals(body: Any) -> Any:
    """``body`` with a description's refusals turned into click's (exit 2, the argument named)."""

    def run(*args: Any) -> Any:
        try:
            return body(*args)
        except views.UsageError as exc:
            raise click.UsageError(str(exc)) from None
        except views.BadArgument as exc:
            raise click.BadParameter(exc.message, param_hint=exc.hint) from None

    return run


def _parameters(callback: Any, arguments: tuple[views.Argument, ...], options: tuple[views.Option, ...]) -> Any:
    """``callback`` with rq's connection options, then ``arguments`` and ``options`` in the order ``--help`` lists
    them (click's decorators apply innermost first)."""
    callback = pass_cli_config(callback)
    for option in reversed(options):
        callback = _click_option(option)(callback)
    for argument in reversed(arguments):
        extra = {'metavar': argument.metavar} if argument.metavar else {}
        if argument.kind is not str:
            extra['type'] = _click_type(argument.kind)
        callback = click.argument(argument.name, required=argument.required, **extra)(callback)
    return callback


def _command(view: views.Command) -> click.Command:
    def body(cli_config: Any, values: dict[str, Any]) -> None:
        if view.prepare is not None:
            values = dict(view.prepare(values))
        _echo(view.run(_connect(cli_config), values))

    def callback(cli_config: Any, **values: Any) -> None:
        _refusals(body)(cli_config, values)

    callback.__doc__ = view.help
    return click.command(view.name, cls=Command)(_parameters(callback, view.arguments, view.options))


def _setting(view: views.Setting) -> click.Command:
    def body(cli_config: Any, values: dict[str, Any]) -> None:
        value, clear = values[view.value.name], values.get('clear', False)
        if clear and value is not None:
            raise views.UsageError(f'give either {view.value.label} or --clear, not both')
        mode = 'clear' if clear else 'status' if value is None else 'set'
        if view.prepare is not None:
            values = dict(view.prepare(values, mode))
        if mode == 'status' and values.get('wait_replicas') is not None:
            raise views.UsageError('--wait-replicas waits for a write; reading the setting writes nothing')
        conn = _connect(cli_config)
        if mode == 'status':
            _echo(view.status(conn, values))
            return
        if view.force_help is not None:
            _require_known(conn, values[view.targets[0].name], values.get('force') or clear, command=view.name)
        _echo((view.clear if clear else view.set)(conn, values))
        _wait_replicas(conn, values)

    def callback(cli_config: Any, **values: Any) -> None:
        values.setdefault('as_json', False)
        _refusals(body)(cli_config, values)

    options = list(view.options) + [views.Option('--clear', 'clear', view.clear_help, is_flag=True)]
    options += _WAIT_OPTIONS
    if view.force_help is not None:
        options.append(views.Option('--force', 'force', view.force_help, is_flag=True))
    if view.json_help is not None:
        options.append(views.Option('--json', 'as_json', view.json_help, is_flag=True))
    arguments = view.targets + (views.Argument(view.value.name, False, view.value.kind, view.value.metavar),)
    callback.__doc__ = view.help
    return click.command(view.name, cls=Command)(_parameters(callback, arguments, tuple(options)))


def _group(view: views.Group) -> click.Group:
    def callback() -> None:
        pass

    callback.__doc__ = view.help
    group = click.group(view.name)(callback)
    for item in view.commands:
        group.add_command(_view(item))
    return group


def _view(view: views.View) -> click.Command:
    """A policy's command description as a click command."""
    if isinstance(view, views.Setting):
        return _setting(view)
    if isinstance(view, views.Group):
        return _group(view)
    return _command(view)


for _views in views.shown():
    for _description in _views.commands():
        main.add_command(_view(_description))


def cli(argv: list[str] | None = None) -> None:
    """The console script: click's parsing, with every error reduced to one line and a non-zero exit."""
    try:
        main.main(args=argv, prog_name='rq-policies', standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:
        click.echo(f'Error: {exc.format_message()}', err=True)
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        click.echo(f'Error: {exc.format_message()}', err=True)
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo('Aborted.', err=True)
        sys.exit(1)
    except RedisError as exc:
        click.echo(f'Error: Redis: {exc}', err=True)
        sys.exit(1)
    except Exception as exc:  # the promise is one line, never a traceback
        click.echo(f'Error: {type(exc).__name__}: {exc}', err=True)
        sys.exit(1)


if __name__ == '__main__':
    cli()
