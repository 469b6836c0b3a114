"""The dashboard's Flask blueprint: the pages, the JSON endpoint, and the actions behind a confirmation.

Read-only unless built with ``allow_actions=True``. Everything that comes from Redis is user data (queue names, keys,
job ids and descriptions) and is rendered by Jinja's autoescaping, never marked safe; a Content-Security-Policy that
allows only the blueprint's own script and stylesheet backs that up, so even a missed escape runs no script. An action
is a POST carrying a CSRF token (the double-submit pattern: a random token in a ``SameSite=Strict`` cookie, repeated
in the form, as Django does without sessions), and it runs only after a confirmation page that says what it will
change and what the state is now.

Actions call the public APIs, through the registry: a fetch policy's ``set``/``clear`` for a queue (a cap, a rate: the
settings its views' ``queue_settings`` name), :func:`rq_policies.surfaces.state.reset_digest` (what ``rq-policies
reset`` runs), and ``override(scope, key, limit, connection=)`` on any registered policy that offers it (a per-key
limit). An empty limit clears the override: through the policy's ``clear(scope, key, connection=)`` when it has one
(what ``rq-policies override --clear`` runs), else ``override`` with ``limit=None``. The confirmation page shows the
key's override now when the policy offers ``get(scope, key, connection=)``, whose own checks also refuse a malformed
scope or key before anything is asked. A registered policy whose run-time switch is pausing one key
(``key_pause_setting``) is offered a pause and a resume: its ``pause(scope, key, connection=)``/``resume(...)`` (what
``rq-policies <policy> pause|resume`` runs), the confirmation showing its ``pause_status(scope, key, connection=)`` now
(paused or not, its waiting jobs per queue), whose checks refuse a malformed scope or key first. One whose run-time
setting is one weight per key (``key_weight_setting``) is offered a weight: ``set(scope, key, weight, connection=)``,
an empty weight ``clear``, the confirmation showing ``get`` now. Every value is checked by the policy's views
(``check_setting``) before the confirmation page offers it.
"""

from __future__ import annotations

import hmac
import re
import secrets
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from flask import Blueprint, abort, current_app, g, jsonify, make_response, render_template, request

from rq_policies.engine import keys, reading, views
from rq_policies.engine.policy import FETCH
from rq_policies.surfaces import explainer, replicas, state

from . import data

#: The CSRF cookie and form field.
CSRF_COOKIE = 'rq_policies_csrf'
CSRF_FIELD = 'csrf'

#: Headers on every response of the blueprint: only its own script and stylesheet run, it is never framed, and a
#: page of live state is never cached.
SECURITY_HEADERS = {
    'Content-Security-Policy': "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    'X-Content-Type-Options': 'nosniff',
    'X-Frame-Options': 'DENY',
    'Referrer-Policy': 'no-referrer',
    'Cache-Control': 'no-store',
}

_TOKEN = re.compile(r'[0-9a-f]{64}')
_DIGITS = re.compile(r'[0-9]+')
#: The most characters of a search the page passes on (it becomes part of a SCAN pattern).
SEARCH_MAX = 200


class ActionError(ValueError):
    """An action's form is wrong (a field missing or malformed): the page says which, and nothing is written."""


def configurable() -> list[type]:
    """Fetch policies whose settings live in Redis and can be set per queue (a cap, a rate): their views name the
    settings (``queue_settings``) their ``set(queue, ..., connection=)`` takes."""
    return [found.policy for found in views.shown(FETCH) if found.queue_settings]


def _setting_fields(cls: type) -> list[str]:
    """The settings the dashboard's form offers for fetch policy ``cls``, in order."""
    return list(views.views_of(cls.name).queue_settings)


def overridable() -> list[type]:
    """Registered policies whose run-time setting is one limit per key (``set(scope, key, limit, connection=)``,
    ``get``, ``clear``: :mod:`rq_policies.engine.admin`)."""
    return [found.policy for found in views.shown() if found.key_limit_setting]


def weighable() -> list[type]:
    """Registered policies whose run-time setting is one weight per key (``set(scope, key, weight, connection=)``,
    ``get`` with ``.weight``, ``clear``)."""
    return [found.policy for found in views.shown() if found.key_weight_setting]


def pausable() -> list[type]:
    """Registered policies whose run-time switch is pausing one key of a scope (``pause``/``resume(scope, key,
    connection=)``, and ``pause_status(scope, key, connection=)`` with ``paused`` and ``waiting`` per queue)."""
    return [found.policy for found in views.shown() if found.key_pause_setting]


def _field(form: Any, name: str, required: bool = True) -> str:
    value = form.get(name, '')
    if required and not value:
        raise ActionError(f'{name} is required')
    return value


def _integer(name: str, raw: str) -> int:
    if not _DIGITS.fullmatch(raw):
        raise ActionError(f'{name} must be a whole number (digits 0-9), got {raw!r}')
    return int(raw)


def _policy(name: str, choices: list[type]) -> Any:
    for cls in choices:
        if cls.name == name:
            return cls
    raise ActionError(f'policy must be one of {[cls.name for cls in choices]}, got {name!r}')


def _queue_words(connection: Any, queue: str, cls: type | None = None) -> str:
    """The queue's headline now, as ``rq-policies info`` prints it (``cap 3, 1 in use, rate 5/1s ...``); with
    ``cls``, only that fetch policy's words (a rate's confirmation shows the rate, not the cap)."""
    now = state.server_now(connection)
    if cls is not None:
        found = views.views_of(cls.name).queue_info(connection, [queue], now, 0).get(queue)
        return (found.headline() if found is not None else '') or f'no {cls.name} setting'
    return ', '.join(state.headline(state.queue_sections(connection, [queue], now, 0)[queue])) or 'no setting'


def _override_words(connection: Any, cls: type, scope: str, key: str) -> str:
    """A key's override now (``override 10``, ``no override``) when the policy reports it, else ''.

    Raises:
        ActionError: the policy's own check refused the scope or the key (nothing is written).
    """
    try:
        found = cls.get(scope, key, connection=connection)
        value = None if found is None else found.limit
    except (TypeError, ValueError) as exc:
        raise ActionError(str(exc)) from None
    return 'no override' if value is None else f'override {value}'


def _weight_words(connection: Any, cls: type, scope: str, key: str) -> str:
    """A key's run-time weight now (``weight 3``, ``no weight set: its jobs' declared weight applies``).

    Raises:
        ActionError: the policy's own check refused the scope or the key (nothing is written).
    """
    try:
        found = cls.get(scope, key, connection=connection)
    except (TypeError, ValueError) as exc:
        raise ActionError(str(exc)) from None
    return "no weight set: its jobs' declared weight applies" if found is None else f'weight {found.weight}'


def _pause_words(connection: Any, cls: type, scope: str, key: str) -> str:
    """A key's pause state now (``paused, 3 waiting job(s) ('default': 2, 'mail': 1)``).

    Raises:
        ActionError: the policy's own check refused the scope or the key (nothing is written).
    """
    try:
        found = cls.pause_status(scope, key, connection=connection)
    except (TypeError, ValueError) as exc:
        raise ActionError(str(exc)) from None
    where = ', '.join(f'{queue!r}: {n}' for queue, n in sorted(found.waiting.items()))
    return (f'{"paused" if found.paused else "not paused"}, {sum(found.waiting.values())} waiting job(s)'
            + (f' ({where})' if where else ''))


def plan(connection: Any, action: str, form: Any) -> tuple[str, str, Callable[[], str]]:
    """Read and check an action's form: ``(what it will do, the state now, the function that does it)``.

    Raises:
        ActionError: naming the field and the value; nothing has been written.
    """
    if action in ('configure', 'unconfigure'):
        cls = _policy(_field(form, 'policy'), configurable())
        queue = _field(form, 'queue')
        if not reading.known_queue(connection, queue):
            raise ActionError(
                f'queue {queue!r} is unknown: rq has no such queue, no policy has a setting for it and '
                'no worker listens to it'
            )
        now = _queue_words(connection, queue, cls)
        if action == 'unconfigure':

            def unconfigure() -> str:
                cls.clear(queue, connection=connection)
                return f'Removed the {cls.name} setting of queue {queue!r}.'

            return f'Remove the {cls.name} setting of queue {queue!r}.', now, unconfigure
        settings = {name: _integer(name, form[name]) for name in _setting_fields(cls) if form.get(name)}
        if not settings:
            raise ActionError(f'give at least one of {_setting_fields(cls)}')
        try:  # the policy's own check, before the confirmation: a value it refuses is never offered to confirm
            views.views_of(cls.name).check_setting(settings)
        except (TypeError, ValueError) as exc:
            raise ActionError(str(exc)) from None
        words = ', '.join(f'{k}={v}' for k, v in settings.items())

        def configure() -> str:
            cls.set(queue, connection=connection, **settings)
            return f'Queue {queue!r}: {cls.name} set to {words}.'

        return f'Set {cls.name} of queue {queue!r} to {words}.', now, configure
    if action == 'reset':
        queue, digest = _field(form, 'queue'), _field(form, 'digest')
        if not _TOKEN.fullmatch(digest):
            raise ActionError(f'digest must be an identity digest (64 lowercase hex characters), got {digest!r}')
        return (
            f'Reset identity {digest} on queue {queue!r}: its loner marker, throttle windows and pending '
            'trailing and debounced jobs are cleared (queued jobs are left alone).',
            f'{len(state.identity_keys(connection, queue, digest))} key(s) of this identity',
            lambda: (
                f'Identity {digest[:12]} on {queue!r}: removed {state.reset_digest(connection, queue, digest)} key(s).'
            ),
        )
    if action == 'override':
        cls = _policy(_field(form, 'policy'), overridable())
        scope, key = _field(form, 'scope'), _field(form, 'key')
        raw = _field(form, 'limit', required=False)
        limit = _integer('limit', raw) if raw else None
        change = f'the {cls.name} limit of key {key!r} in scope {scope!r}'
        what = f'Override {change} to {limit}.' if limit is not None else f'Clear the override of {change}.'
        now = _override_words(connection, cls, scope, key)

        def override() -> str:
            if limit is not None:
                cls.set(scope, key, limit, connection=connection)
                return f'Overrode {change}: {limit}.'
            cls.clear(scope, key, connection=connection)
            return f'Cleared the override of {change}.'

        return what, now, override
    if action == 'weight':
        cls = _policy(_field(form, 'policy'), weighable())
        scope, key = _field(form, 'scope'), _field(form, 'key')
        raw = _field(form, 'weight', required=False)
        weight = _integer('weight', raw) if raw else None
        if weight is not None:
            try:  # the policy's own check, before the confirmation
                views.views_of(cls.name).check_setting({'weight': weight})
            except (TypeError, ValueError) as exc:
                raise ActionError(str(exc)) from None
        change = f'the {cls.name} weight of key {key!r} in scope {scope!r}'
        what = f'Set {change} to {weight}.' if weight is not None else f'Clear {change}.'
        now = _weight_words(connection, cls, scope, key)

        def reweigh() -> str:
            if weight is not None:
                cls.set(scope, key, weight, connection=connection)
                return f'Set {change}: {weight}.'
            cls.clear(scope, key, connection=connection)
            return f'Cleared {change}.'

        return what, now, reweigh
    if action in ('pause', 'resume'):
        cls = _policy(_field(form, 'policy'), pausable())
        scope, key = _field(form, 'scope'), _field(form, 'key')
        target = f'{cls.name} key {key!r} of scope {scope!r}'
        now = _pause_words(connection, cls, scope, key)
        if action == 'pause':
            what = (f'Pause {target} on every queue: its jobs keep waiting and none starts until it is resumed; '
                    'other keys are not touched.')
        else:
            what = f'Resume {target}: it takes turns again on every queue where it has waiting jobs.'

        def switch() -> str:
            changed = getattr(cls, action)(scope, key, connection=connection)
            if action == 'pause':
                return f'Paused {target}.' + ('' if changed else ' (It was paused already.)')
            return f'Resumed {target}.' + ('' if changed else ' (It was not paused.)')

        return what, now, switch
    raise ActionError(f'no action named {action!r}')


def create_blueprint(
    connection: Any = None,
    *,
    allow_actions: bool = False,
    refresh_seconds: float = 2.0,
    name: str = 'rq_policies',
    home: Callable[[], str | None] | None = None,
    read_from_replicas: bool = False,
) -> Blueprint:
    """The dashboard as a Flask blueprint.

    Args:
        connection: a Redis client, or a callable returning one at request time (a host app's own connection, as
            rq-dashboard's ``current_app.redis_conn``).
        allow_actions: show the action forms and accept their POSTs (off: the blueprint is read-only).
        refresh_seconds: how often the page reloads its state (0: never).
        name: the blueprint's name (its endpoints are ``<name>.index``, ...).
        home: returns the URL of the host app's own page for a link back (or None).
        read_from_replicas: on a cluster, the pages (the state, its live refresh, ``state.json``, a job's
            explanation) read through a client of the blueprint's own whose reads go to the replicas of the prefix's
            slot (:mod:`rq_policies.surfaces.replicas`), so they may be a moment stale (the replication lag); the
            actions, their confirmation pages and the state shown after one still use ``connection``, on the primary.
            The reader is built at the first page and closed by ``blueprint.replica_readers.close()``. Refused with a
            :class:`~rq_policies.engine.exceptions.PolicyConfigurationError` naming the option when ``connection`` is
            not a ``redis.cluster.RedisCluster`` (when it is a callable: at the first page).
    """
    option = 'read_from_replicas=True'
    if read_from_replicas and connection is not None and hasattr(connection, 'execute_command'):
        replicas.check(connection, option)
        keys.check_connection(connection)
    blueprint = Blueprint(
        name, __name__, template_folder='templates', static_folder='static', static_url_path='/static'
    )
    readers = _Readers(option)
    blueprint.replica_readers = readers  # type: ignore[attr-defined]

    def redis() -> Any:
        conn = connection() if callable(connection) and not hasattr(connection, 'execute_command') else connection
        if conn is None:
            raise RuntimeError('rq-policies dashboard: no Redis connection (pass connection= to create_blueprint)')
        return conn

    def reads() -> Any:
        """The client the pages read through: the connection, or with ``read_from_replicas`` its replica reader."""
        return readers.reader(redis()) if read_from_replicas else redis()

    def csrf_token() -> str:
        token = request.cookies.get(CSRF_COOKIE, '')
        if not _TOKEN.fullmatch(token):
            token = g.setdefault('rq_policies_new_csrf', secrets.token_hex(32))
        return token

    def context(**extra: Any) -> dict[str, Any]:
        return {
            'allow_actions': allow_actions,
            'refresh_seconds': refresh_seconds,
            'bp': name,
            'home': home() if home else None,
            'csrf': csrf_token() if allow_actions else '',
            **extra,
        }

    def search() -> str | None:
        return (request.args.get('q') or '').strip()[:SEARCH_MAX] or None

    def limit() -> int:
        raw = request.args.get('limit', '')
        return min(int(raw), 1000) if _DIGITS.fullmatch(raw) and int(raw) > 0 else data.ROW_LIMIT

    @blueprint.after_request
    def headers(response: Any) -> Any:
        for header, value in SECURITY_HEADERS.items():
            response.headers.setdefault(header, value)
        token = g.pop('rq_policies_new_csrf', None)
        if token:
            response.set_cookie(
                CSRF_COOKIE,
                token,
                httponly=True,
                samesite='Strict',
                secure=request.is_secure,
                path=request.script_root or '/',
            )
        return response

    @blueprint.route('/')
    def index() -> Any:
        view = data.overview(reads(), search(), limit())
        return render_template(
            'rq_policies/index.html',
            view=view,
            settings=configurable(),
            setting_fields={cls.name: _setting_fields(cls) for cls in configurable()},
            overrides=overridable(),
            pauses=pausable(),
            weights=weighable(),
            **context(),
        )

    @blueprint.route('/partial')
    def partial() -> Any:
        view = data.overview(reads(), search(), limit())
        return render_template('rq_policies/_state.html', view=view, **context())

    @blueprint.route('/state.json')
    def state_json() -> Any:
        return jsonify(data.overview(reads(), search(), limit()))

    @blueprint.route('/job')
    def job() -> Any:
        job_id = (request.args.get('id') or '').strip()
        try:
            answer = explainer.explain(job_id, connection=reads())
        except explainer.UnknownJob as exc:
            return render_template('rq_policies/job.html', job_id=job_id, answer=None, error=str(exc), **context()), 404
        except ValueError as exc:
            return render_template('rq_policies/job.html', job_id=job_id, answer=None, error=str(exc), **context()), 400
        details = [
            {
                'policy': part['policy'],
                'verdict': part.get('verdict', ''),
                'change': part.get('change', ''),
                'details': {k: v for k, v in part.items() if k not in ('policy', 'verdict', 'change')},
            }
            for part in answer['policies']
        ]
        return render_template(
            'rq_policies/job.html', job_id=job_id, answer=answer, parts=details, error=None, **context()
        )

    @blueprint.route('/action/<action>', methods=['POST'])
    def act(action: str) -> Any:
        if not allow_actions:
            abort(403, description='actions are off: start the dashboard with --allow-actions')
        cookie, sent = request.cookies.get(CSRF_COOKIE, ''), request.form.get(CSRF_FIELD, '')
        if not (_TOKEN.fullmatch(cookie) and hmac.compare_digest(cookie, sent)):
            abort(403, description='the CSRF token is missing or wrong: reload the dashboard and try again')
        origin = request.headers.get('Origin')
        if origin and origin != 'null' and urlsplit(origin).netloc != request.host:
            abort(403, description=f'the request comes from another origin ({origin})')
        conn = redis()
        fields = {k: v for k, v in request.form.items() if k not in (CSRF_FIELD, 'confirmed')}
        try:
            what, now, run = plan(conn, action, request.form)
        except ActionError as exc:
            return render_template(
                'rq_policies/action.html',
                error=str(exc),
                what='',
                now='',
                fields={},
                action=action,
                done=None,
                **context(),
            ), 400
        if request.form.get('confirmed') != 'yes':
            return render_template(
                'rq_policies/action.html',
                error=None,
                what=what,
                now=now,
                fields=fields,
                action=action,
                done=None,
                **context(),
            )
        try:
            done = run()
        except (ValueError, TypeError) as exc:  # the policy's own check refused a setting: nothing was written
            return render_template(
                'rq_policies/action.html',
                error=str(exc),
                what=what,
                now=now,
                fields={},
                action=action,
                done=None,
                **context(),
            ), 400
        current_app.logger.warning('rq-policies dashboard action by %s: %s', request.remote_addr, done)
        return render_template(
            'rq_policies/action.html',
            error=None,
            what=what,
            now=_state_after(conn, action, fields),
            fields={},
            action=action,
            done=done,
            **context(),
        )

    @blueprint.errorhandler(403)
    def forbidden(exc: Any) -> Any:
        return make_response(
            render_template(
                'rq_policies/action.html',
                error=exc.description,
                what='',
                now='',
                fields={},
                action='',
                done=None,
                **context(),
            ),
            403,
        )

    def _state_after(conn: Any, action: str, fields: dict[str, str]) -> str:
        """What the confirmation page showed as the state now, read again after the action ran."""
        if action == 'override':
            return _override_words(conn, _policy(fields['policy'], overridable()), fields['scope'], fields['key'])
        if action in ('pause', 'resume'):
            return _pause_words(conn, _policy(fields['policy'], pausable()), fields['scope'], fields['key'])
        if action == 'weight':
            return _weight_words(conn, _policy(fields['policy'], weighable()), fields['scope'], fields['key'])
        queue = fields.get('queue')
        if queue and action in ('configure', 'unconfigure'):
            return _queue_words(conn, queue, _policy(fields['policy'], configurable()))
        return _queue_words(conn, queue) if queue else ''

    return blueprint


def create_app(
    connection: Any, *, allow_actions: bool = False, refresh_seconds: float = 2.0, read_from_replicas: bool = False
) -> Any:
    """A Flask app serving the dashboard at ``/`` (what ``rq-policies dashboard`` runs); the arguments as
    :func:`create_blueprint` takes them (``app.blueprints['rq_policies'].replica_readers.close()`` closes the replica
    reader ``read_from_replicas`` built)."""
    from flask import Flask

    app = Flask('rq_policies.surfaces.dashboard')
    app.register_blueprint(create_blueprint(connection, allow_actions=allow_actions, refresh_seconds=refresh_seconds,
                                            read_from_replicas=read_from_replicas))
    return app


class _Readers:
    """The replica reader of the connection a blueprint's pages read, built at the first page and kept while the
    connection is the same object (a host app's callable may hand out another: its reader then replaces the old)."""

    def __init__(self, option: str) -> None:
        self.option = option
        self._lock = threading.Lock()
        self._connection: Any = None
        self._reader: Any = None

    def reader(self, connection: Any) -> Any:
        with self._lock:
            if self._reader is None or self._connection is not connection:
                self._close()
                self._reader = replicas.replica_reader(connection, self.option)
                self._connection = connection
            return self._reader

    def _close(self) -> None:
        reader, connection, self._reader, self._connection = self._reader, self._connection, None, None
        if reader is not None and replicas.owned(reader, connection):
            reader.close()

    def close(self) -> None:
        """Close the reader built, if any (the connection is the caller's)."""
        with self._lock:
            self._close()
