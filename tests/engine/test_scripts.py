"""Each Lua script called directly: its return value and the Redis state it leaves."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

from rq.queue import Queue

from rq_policies import Loner, PolicyQueue, PolicySet
from rq_policies.engine import keys
from rq_policies.engine.admission import JobWrite, Verdict, admit_call
from rq_policies.engine.compat import KEY_PREFIX as RQ
from rq_policies.engine.fetch import FetchReply, fetch_call
from rq_policies.policies.loner.rules import holder, release_markers

PREFIX = f'{RQ}:job:'


def marker_of(digest):
    return keys.loner('q', digest)


def enqueue(conn, jid, digest='d1', mode='R', ttl=-1, loner=1, dest=f'{RQ}:queue:q', score=0, fields=None):
    """One admission through the builder the queue uses (lua/admit.lua): its verdict, decoded by the one decoder
    (``Verdict.read``), as (code, policy, job id, number, server now, superseded) with the ids as bytes."""
    fields = fields if fields is not None else ['status', 'queued' if mode in 'RL' else 'scheduled', 'origin', 'q']
    spec = PolicySet((Loner(),) if loner else ())
    for item in spec.policies:
        fields = fields + item.job_fields('q', digest)
    job = SimpleNamespace(id=jid, key=PREFIX + jid, result_ttl=None)  # what the builder reads of a Job
    write = JobWrite(job, mode, score, dest, ttl, fields)
    verdict = Verdict.read(admit_call(PolicyQueue('q', connection=conn), spec, digest, write).run(conn))
    return (verdict.code, verdict.policy.encode(), verdict.job_id.encode(), verdict.number, verdict.server_now,
            verdict.superseded.encode())


def admitted(reply):
    return reply[0] == 1


def test_enqueue_job_admits_writes_and_drops(connection):
    reply = enqueue(connection, 'a')
    assert (reply[0], reply[2]) == (1, b'a')
    assert connection.lrange(f'{RQ}:queue:q', 0, -1) == [b'a']
    assert connection.hgetall(PREFIX + 'a') == {
        b'status': b'queued', b'origin': b'q', keys.LONER_FIELD.encode(): marker_of('d1').encode()
    }
    assert connection.smembers(f'{RQ}:queues') == {f'{RQ}:queue:q'.encode()}
    assert connection.get(marker_of('d1')) == b'a'
    assert connection.ttl(marker_of('d1')) == -1

    reply = enqueue(connection, 'b')
    assert (reply[0], reply[2]) == (0, b'a')
    assert not connection.exists(PREFIX + 'b')
    assert connection.lrange(f'{RQ}:queue:q', 0, -1) == [b'a']
    assert connection.hget(keys.DROPS, 'loner:q') == b'1'


def test_enqueue_job_replay_is_admitted_again(connection):
    assert admitted(enqueue(connection, 'a'))
    assert admitted(enqueue(connection, 'a'))  # a retried call whose reply was lost
    assert connection.lrange(f'{RQ}:queue:q', 0, -1) == [b'a']  # and the id is not pushed twice


def test_enqueue_job_replaces_a_stale_marker(connection):
    connection.set(marker_of('d1'), 'gone')  # its job hash does not exist
    assert admitted(enqueue(connection, 'a'))
    connection.hset(PREFIX + 'a', 'status', 'started')  # taken by a stock worker
    assert admitted(enqueue(connection, 'b'))
    assert connection.get(marker_of('d1')) == b'b'


def test_enqueue_job_modes_and_ttl(connection):
    assert admitted(enqueue(connection, 'front', digest='m1', mode='L'))
    assert admitted(enqueue(connection, 'back', digest='m2', mode='R'))
    assert admitted(enqueue(connection, 'first', digest='m3', mode='L'))
    assert connection.lrange(f'{RQ}:queue:q', 0, -1) == [b'first', b'front', b'back']
    assert admitted(enqueue(connection, 's', digest='m4', mode='S', score=1234, dest=f'{RQ}:scheduled:q'))
    assert connection.zscore(f'{RQ}:scheduled:q', 's') == 1234
    assert admitted(enqueue(connection, 'd', digest='m5', mode='D', ttl=50, fields=['status', 'deferred']))
    assert connection.llen(f'{RQ}:queue:q') == 3  # mode D writes the hash only
    assert 0 < connection.ttl(PREFIX + 'd') <= 50 and 0 < connection.ttl(marker_of('m5')) <= 50
    assert admitted(enqueue(connection, 'plain', digest='m6', loner=0))
    assert not connection.exists(marker_of('m6'))


def test_enqueue_job_keeps_binary_values_intact(connection):
    blob = bytes(range(256)) + b':12:' + 'é'.encode()
    assert admitted(enqueue(connection, 'bin', fields=['data', blob, 'empty', b'']))
    assert connection.hget(PREFIX + 'bin', 'data') == blob
    assert connection.hget(PREFIX + 'bin', 'empty') == b''


def test_loner_holder_reads_without_writing(connection):
    args = (connection, 'q', 'd', PREFIX)
    assert holder(*args) is None
    connection.set(keys.loner('q', 'd'), 'j1')
    assert holder(*args) is None  # no such job: stale
    connection.hset(PREFIX + 'j1', 'status', 'scheduled')
    assert holder(*args) == 'j1'
    connection.hset(PREFIX + 'j1', 'status', 'finished')
    assert holder(*args) is None
    assert connection.get(keys.loner('q', 'd')) == b'j1'  # read-only


def test_release_markers_only_frees_markers_still_naming_the_job(connection):
    connection.hset(PREFIX + 'old', keys.LONER_FIELD, 'marker')
    connection.hset(PREFIX + 'new', keys.LONER_FIELD, 'marker')
    connection.set('marker', 'new')
    assert release_markers(connection, PREFIX, ['old', 'missing']) == 0
    assert connection.get('marker') == b'new'
    assert release_markers(connection, PREFIX, ['new']) == 1
    assert not connection.exists('marker')


_tokens = itertools.count()


def fetch(conn):
    """lua/fetch.lua on queue q ('rq:queue:q', 'rq:queue:q:intermediate'), a new claim token each, holds of 90 s: its
    reply decoded (rq_policies.engine.fetch.FetchReply)."""
    return FetchReply.decode(fetch_call([Queue('q', connection=conn)], f'tok{next(_tokens)}', 90, PREFIX).run(conn))


def test_fetch_pops_clears_marker_and_skips_dangling_ids(connection):
    connection.rpush(f'{RQ}:queue:q', 'dangling', 'j1')
    connection.hset(PREFIX + 'j1', mapping={'status': 'queued', keys.LONER_FIELD: 'marker'})
    connection.set('marker', 'j1')
    result = fetch(connection)
    assert (result.queue, result.job, result.holds) == (1, 'j1', ())  # no fetch policy took a hold
    assert not connection.exists('marker')
    assert connection.lrange(f'{RQ}:queue:q:intermediate', 0, -1) == [b'j1']  # the dangling id was dropped
    assert not connection.exists(keys.holds('q'))  # uncapped: no hold
    empty = fetch(connection)
    assert (empty.job, empty.waiting, empty.full, empty.until) == (None, 0, (), None)


def test_fetch_leaves_the_marker_of_a_newer_job(connection):
    connection.rpush(f'{RQ}:queue:q', 'old')
    connection.hset(PREFIX + 'old', mapping={'status': 'queued', keys.LONER_FIELD: 'marker'})
    connection.set('marker', 'newer')
    fetch(connection)
    assert connection.get('marker') == b'newer'


def test_scripts_run_inside_a_pipeline(connection):
    connection.script_flush()  # the pipeline must load what is missing (NOSCRIPT fallback)
    with connection.pipeline() as pipe:
        holder(pipe, 'q', 'd', PREFIX)
        release_markers(pipe, PREFIX, ['x'])
        assert pipe.execute() == [None, 0]


def test_the_pure_lua_msgpack_decoder_agrees_with_cmsgpack(connection):
    """lib/codec.lua's own decoder (fakeredis has no cmsgpack) run on the real server beside cmsgpack, on every type
    ops.py sends: both must give the same value, floats of both widths included."""
    import msgpack

    from rq_policies.engine import scripts

    codec = scripts._lua_root().joinpath('lib/codec.lua').read_text(encoding='utf-8')
    probe = codec + '\nreturn cjson.encode({decode_msgpack(ARGV[1]), cmsgpack.unpack(ARGV[1])})'
    values = [
        {'a': 1, 'b': -1, 'c': -33, 'd': 300, 'e': -40000, 'f': 2 ** 40, 'g': -(2 ** 40), 'h': 'x' * 40},
        {'floats': [0.5, -2.25, 1e-300, 5e-324, 123456.789, -0.0, 3.0e38]},
        {'nested': {'list': [1, [2, [3]], {'k': 'v'}], 'yes': True, 'no': False}},
        {'long': 'y' * 70000, 'many': list(range(20))},
    ]
    for value in values:
        for single in (False, True):
            packed = msgpack.packb(value, use_bin_type=False, use_single_float=single)
            ours, theirs = json.loads(connection.eval(probe, 0, packed))
            assert ours == theirs, (value, single)


def test_every_lean_source_compiles_and_fakeredis_gets_the_full_one(connection):
    """An EVAL on a pipeline that cannot carry EVALSHA carries the lean source (no comment lines, cmsgpack's
    decoder): each one must compile on a real server, and a fakeredis client (no cmsgpack) must get the full source,
    whose own decoder it needs."""
    import fakeredis

    from rq_policies.engine import scripts

    names = sorted(item.name[:-4] for item in scripts._lua_root().iterdir() if item.name.endswith('.lua'))
    assert 'push' in names and 'admit' in names
    for name in names:
        lean = scripts.lean_source(name)
        assert b'decode_msgpack' not in lean and b'\n--' not in lean
        connection.script_load(lean)  # compiles, or raises
        assert scripts.eval_source(name, connection.pipeline()) == lean
        assert scripts.eval_source(name, fakeredis.FakeRedis().pipeline()) == scripts.script(name).script


def _on_rqs_pipeline(queue: PolicyQueue, *args, **kwargs):
    """A plain enqueue that stays on rq's own pipeline (a caller's ``pipeline=``), whose push is lua/push.lua."""
    with queue.connection.pipeline() as pipe:
        job = queue.enqueue(*args, pipeline=pipe, **kwargs)
        pipe.execute()
    return job


def _push(queue: PolicyQueue, job_id: str, pipeline=None):
    call = queue._push_call(job_id, 'R', queue.key, wake=keys.wake(queue.name))
    return call, call.run(pipeline if pipeline is not None else queue.connection)


def test_push_sent_twice_pushes_once_and_a_later_push_pushes_again(connection):
    """lua/push.lua: the same call twice (redis-py's resend) pushes once; a new call for the same id (a retry, after a
    worker took it) pushes; a replay of the first call arriving after up to three later pushes still pushes nothing;
    the record in the job's hash stays bounded whatever the number of pushes."""
    q = PolicyQueue('q', connection=connection)
    job = _on_rqs_pipeline(q, 'tests.helpers.jobs.plain', 1)
    assert connection.lrange(q.key, 0, -1) == [job.id.encode()]
    connection.delete(q.key)
    first, pushed = _push(q, job.id)
    assert pushed == 1 and first.run(connection) == 0
    assert connection.lrange(q.key, 0, -1) == [job.id.encode()]
    for _ in range(3):  # taken, failed, retried: three legitimate later pushes
        connection.delete(q.key)
        assert _push(q, job.id)[1] == 1
    assert first.run(connection) == 0  # the late replay of the first call
    assert connection.lrange(q.key, 0, -1) == [job.id.encode()]
    for _ in range(50):
        _push(q, job.id)
    assert len(connection.hget(job.key, 'policies_push')) == 52  # four tokens, never more


def test_push_of_an_id_without_a_hash_pushes_and_makes_no_hash(connection):
    q = PolicyQueue('q', connection=connection)
    call, pushed = _push(q, 'gone')
    assert pushed == 1 and connection.lrange(q.key, 0, -1) == [b'gone']
    assert not connection.exists(PREFIX + 'gone')


def test_the_push_record_survives_rqs_own_saves_and_reads(connection):
    """rq ignores a job hash field it does not know: Job.fetch, refresh and a later job.save() (the worker saves the
    job at start and end) read and write the job as before, and the save keeps the record (a replay of the enqueue
    that arrives after it is still recognised)."""
    from rq.job import Job

    q = PolicyQueue('q', connection=connection)
    job = _on_rqs_pipeline(q, 'tests.helpers.jobs.plain', 7)
    record = connection.hget(job.key, 'policies_push')
    assert record and len(record) == 13  # one token and its separator
    fetched = Job.fetch(job.id, connection=connection)
    assert fetched.args == (7,) and fetched.get_status() == 'queued'
    fetched.meta['seen'] = True
    fetched.save()
    fetched.refresh()
    assert fetched.meta == {'seen': True}
    assert connection.hget(job.key, 'policies_push') == record


def test_a_replayed_push_of_a_job_deleted_since_deletes_the_hash_its_resend_wrote(connection):
    """A job rq deletes once it succeeds (``result_ttl=0``) may be gone when the resend of its enqueue arrives, and
    the resent transaction has just written its hash again (without the push record field). The record kept beside
    it (``keys.pushed``) recognises the replay: nothing is pushed and the hash the resend brought back goes."""
    from rq.job import Job

    q = PolicyQueue('q', connection=connection)
    job = _on_rqs_pipeline(q, 'tests.helpers.jobs.plain', 1, result_ttl=0)
    assert connection.ttl(keys.pushed(job.id)) > 0  # a short-lived job: its tokens are kept beside it
    connection.delete(q.key)
    call, pushed = _push(q, job.id)
    assert pushed == 1
    connection.delete(q.key)  # a worker took it, ran it, and rq deleted it (result_ttl=0)
    Job.fetch(job.id, connection=connection).delete()
    job.save()  # the resent transaction writes the hash again, then its push arrives
    assert call.run(connection) == 0
    assert connection.lrange(q.key, 0, -1) == [] and not connection.exists(job.key)
    kept = q.enqueue('tests.helpers.jobs.plain', 2)  # a job kept after it runs needs no record beside it
    assert not connection.exists(keys.pushed(kept.id))


def _plain_call(queue: PolicyQueue, *args, **kwargs):
    """A plain door's write of a new job (``admission.plain_call``), built as ``PolicyQueue.enqueue`` builds it."""
    from rq_policies.engine.admission import plain_call

    job = queue.create_job('tests.helpers.jobs.plain', args=args, **kwargs)
    return job, plain_call(queue, queue._plain_write(job, False, None))


def test_a_plain_write_sent_again_after_its_job_ran_writes_nothing(connection):
    """lua/admit.lua with no policy: the same call again (redis-py's resend) finds the job's own ``created_at`` and
    writes nothing, however far the job got meanwhile (here: a worker ran it and rq kept its result)."""
    q = PolicyQueue('q', connection=connection)
    job, call = _plain_call(q, 1)
    call.run(connection)
    assert connection.lrange(q.key, 0, -1) == [job.id.encode()]
    assert connection.hget(job.key, 'status') == b'queued'
    connection.delete(q.key)  # a worker took it and ran it
    connection.hset(job.key, mapping={'status': 'finished', 'started_at': 's', 'ended_at': 'e', 'worker_name': 'w'})
    ran = connection.hgetall(job.key)
    call.run(connection)
    assert connection.hgetall(job.key) == ran and connection.lrange(q.key, 0, -1) == []
    assert not connection.exists(keys.pushed(job.id))  # a kept job needs no record beside it
    again, second = _plain_call(q, 1, job_id=job.id)  # a new enqueue of the same id is a new job: it is written
    second.run(connection)
    assert connection.lrange(q.key, 0, -1) == [job.id.encode()]
    assert connection.hget(job.key, 'status') == b'queued'


def test_a_plain_write_sent_again_after_rq_deleted_its_job_writes_nothing(connection):
    """A job rq deletes once it succeeds (``result_ttl=0``) may be gone when the resend arrives: the record beside it
    (``keys.pushed``, its ``created_at``) recognises the replay, which neither writes the hash again nor pushes."""
    q = PolicyQueue('q', connection=connection)
    job, call = _plain_call(q, 1, result_ttl=0)
    call.run(connection)
    assert 0 < connection.ttl(keys.pushed(job.id)) <= keys.PUSHED_SECONDS
    connection.delete(q.key, job.key)  # ran, and rq deleted it
    call.run(connection)
    assert not connection.exists(job.key) and connection.lrange(q.key, 0, -1) == []


def test_an_admin_script_sent_twice_with_one_request_id_answers_the_first_runs_answer_and_writes_nothing(connection):
    """lua/lib/answer.lua, in each admin script whose answer depends on what it changed: the second run of one call
    (its request id) answers the first run's answer, even once another call changed the state since (it writes
    nothing: a replay must not undo that change), and a call without an answer key keeps nothing."""
    from rq_policies.engine.ops import Call
    from rq_policies.policies.fair.rules import _pause_call

    def clear_call():
        return Call('clear_setting', field='q', wake=None, message='').key('settings', keys.CAPACITY) \
            .key_list('also', [keys.rate_tat('q')])

    connection.hset(keys.CAPACITY, 'q', 3)
    connection.set(keys.rate_tat('q'), '1 1')
    call = clear_call().answered()
    assert call.run(connection) == 1
    assert connection.hget(keys.CAPACITY, 'q') is None and connection.exists(keys.rate_tat('q')) == 0
    connection.hset(keys.CAPACITY, 'q', 5)  # another call sets it again
    assert call.run(connection) == 1  # the replay answers the first run's answer...
    assert connection.hget(keys.CAPACITY, 'q') == b'5'  # ...and removes nothing
    assert clear_call().run(connection) == 1 and clear_call().run(connection) == 0  # no answer key: a plain clear
    record = call.keys[call.args['k']['answer'] - 1]
    assert connection.get(record) == b'1' and 0 < connection.ttl(record) <= keys.ANSWER_TTL

    pause = _pause_call('scope', 'k', True).answered()
    assert pause.run(connection) == 1
    connection.hdel(f'{keys.PREFIX}fair:paused', 'scope:k')  # resumed by another call meanwhile
    assert pause.run(connection) == 1 and connection.hexists(f'{keys.PREFIX}fair:paused', 'scope:k') == 0

    release = Call('release_hold', token='t', wake=None, message='').key('ledger', keys.holds('q')).answered()
    connection.zadd(keys.holds('q'), {'t': 10**10})
    assert release.run(connection) == 1 and release.run(connection) == 1
    assert connection.zcard(keys.holds('q')) == 0
