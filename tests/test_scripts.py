"""Each Lua script called directly: its return value and the Redis state it leaves."""

from __future__ import annotations

from rq.queue import Queue

from rq_policies import keys, scripts
from rq_policies.fetch import fetch_call
from rq_policies.queue import pack_fields

PREFIX = 'rq:job:'


def enqueue(conn, jid, marker='rq:policies:loner:q:d1', mode='R', ttl=-1, loner=1, dest='rq:queue:q', score=0,
            fields=None):
    fields = fields if fields is not None else ['status', 'queued' if mode in 'RL' else 'scheduled', 'origin', 'q']
    if loner:
        fields = fields + [keys.LONER_FIELD, marker]
    return scripts.run(
        'enqueue_job', conn,
        [PREFIX + jid, dest, 'rq:queues', marker, keys.DROPS],
        [jid, mode, score, ttl, 'rq:queue:q', PREFIX, loner, 'loner:q', keys.wake('q'), pack_fields(fields)],
    )


def test_enqueue_job_admits_writes_and_drops(connection):
    assert enqueue(connection, 'a') == [1, b'a']
    assert connection.lrange('rq:queue:q', 0, -1) == [b'a']
    assert connection.hgetall(PREFIX + 'a') == {
        b'status': b'queued', b'origin': b'q', keys.LONER_FIELD.encode(): b'rq:policies:loner:q:d1'
    }
    assert connection.smembers('rq:queues') == {b'rq:queue:q'}
    assert connection.get('rq:policies:loner:q:d1') == b'a'
    assert connection.ttl('rq:policies:loner:q:d1') == -1

    assert enqueue(connection, 'b') == [0, b'a']
    assert not connection.exists(PREFIX + 'b')
    assert connection.lrange('rq:queue:q', 0, -1) == [b'a']
    assert connection.hget(keys.DROPS, 'loner:q') == b'1'


def test_enqueue_job_replay_is_admitted_again(connection):
    assert enqueue(connection, 'a') == [1, b'a']
    assert enqueue(connection, 'a')[0] == 1  # a retried call whose reply was lost


def test_enqueue_job_replaces_a_stale_marker(connection):
    connection.set('rq:policies:loner:q:d1', 'gone')  # its job hash does not exist
    assert enqueue(connection, 'a') == [1, b'a']
    connection.hset(PREFIX + 'a', 'status', 'started')  # taken by a stock worker
    assert enqueue(connection, 'b') == [1, b'b']
    assert connection.get('rq:policies:loner:q:d1') == b'b'


def test_enqueue_job_modes_and_ttl(connection):
    assert enqueue(connection, 'front', marker='m1', mode='L')[0] == 1
    assert enqueue(connection, 'back', marker='m2', mode='R')[0] == 1
    assert enqueue(connection, 'first', marker='m3', mode='L')[0] == 1
    assert connection.lrange('rq:queue:q', 0, -1) == [b'first', b'front', b'back']
    assert enqueue(connection, 's', marker='m4', mode='S', score=1234, dest='rq:scheduled:q')[0] == 1
    assert connection.zscore('rq:scheduled:q', 's') == 1234
    assert enqueue(connection, 'd', marker='m5', mode='D', ttl=50, fields=['status', 'deferred'])[0] == 1
    assert connection.llen('rq:queue:q') == 3  # mode D writes the hash only
    assert 0 < connection.ttl(PREFIX + 'd') <= 50 and 0 < connection.ttl('m5') <= 50
    assert enqueue(connection, 'plain', marker='m6', loner=0)[0] == 1
    assert not connection.exists('m6')


def test_enqueue_job_keeps_binary_values_intact(connection):
    blob = bytes(range(256)) + b':12:' + 'é'.encode()
    assert enqueue(connection, 'bin', fields=['data', blob, 'empty', b''])[0] == 1
    assert connection.hget(PREFIX + 'bin', 'data') == blob
    assert connection.hget(PREFIX + 'bin', 'empty') == b''


def test_loner_holder_reads_without_writing(connection):
    args = ([keys.loner('q', 'd')], [PREFIX])
    assert scripts.run('loner_holder', connection, *args) is None
    connection.set(keys.loner('q', 'd'), 'j1')
    assert scripts.run('loner_holder', connection, *args) is None  # no such job: stale
    connection.hset(PREFIX + 'j1', 'status', 'scheduled')
    assert scripts.run('loner_holder', connection, *args) == b'j1'
    connection.hset(PREFIX + 'j1', 'status', 'finished')
    assert scripts.run('loner_holder', connection, *args) is None
    assert connection.get(keys.loner('q', 'd')) == b'j1'  # read-only


def test_release_markers_only_frees_markers_still_naming_the_job(connection):
    connection.hset(PREFIX + 'old', keys.LONER_FIELD, 'marker')
    connection.hset(PREFIX + 'new', keys.LONER_FIELD, 'marker')
    connection.set('marker', 'new')
    assert scripts.run('release_markers', connection, [], [PREFIX, 'old', 'missing']) == 0
    assert connection.get('marker') == b'new'
    assert scripts.run('release_markers', connection, [], [PREFIX, 'new']) == 1
    assert not connection.exists('marker')


def fetch(conn):
    """lua/fetch.lua on queue q ('rq:queue:q', 'rq:queue:q:intermediate'), token 'tok', holds of 90 s."""
    return fetch_call([Queue('q', connection=conn)], 'tok', 90, PREFIX).run(conn)


def test_fetch_pops_clears_marker_and_skips_dangling_ids(connection):
    connection.rpush('rq:queue:q', 'dangling', 'j1')
    connection.hset(PREFIX + 'j1', mapping={'status': 'queued', keys.LONER_FIELD: 'marker'})
    connection.set('marker', 'j1')
    result = fetch(connection)
    assert result == [1, b'j1', 0]
    assert not connection.exists('marker')
    assert connection.lrange('rq:queue:q:intermediate', 0, -1) == [b'j1']  # the dangling id was dropped
    assert not connection.exists(keys.holds('q'))  # uncapped: no hold
    empty = fetch(connection)
    assert empty == [0, 0]


def test_fetch_leaves_the_marker_of_a_newer_job(connection):
    connection.rpush('rq:queue:q', 'old')
    connection.hset(PREFIX + 'old', mapping={'status': 'queued', keys.LONER_FIELD: 'marker'})
    connection.set('marker', 'newer')
    fetch(connection)
    assert connection.get('marker') == b'newer'


def test_scripts_run_inside_a_pipeline(connection):
    connection.script_flush()  # the pipeline must load what is missing (NOSCRIPT fallback)
    with connection.pipeline() as pipe:
        scripts.run('loner_holder', pipe, [keys.loner('q', 'd')], [PREFIX])
        scripts.run('release_markers', pipe, [], [PREFIX, 'x'])
        assert pipe.execute() == [None, 0]
