"""The recorder (tests/history/record.py): one file per process, a forked child's of its own, stamps on the server's
clock within the bound its hello reports."""

from __future__ import annotations

import json
import os
import time
from urllib.parse import urlparse

import pytest

from tests.helpers.cluster import not_on_cluster
from tests.history import record

pytestmark = not_on_cluster('the recorder reads TIME of one server; on a cluster it is given every node alike')


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def address(redis_url):
    parsed = urlparse(redis_url)
    return [(parsed.hostname or '127.0.0.1', parsed.port or 6379)]


def test_each_event_is_stamped_with_the_servers_clock_within_the_bound_hello_reports(tmp_path, address, connection):
    rec = record.Recorder(tmp_path, 'producer-1', 'producer', addresses=address, topology='single')
    seconds, micros = connection.time()
    t = rec.event('invoke', op='producer-1:1')
    after_seconds, after_micros = connection.time()
    hello, invoke = lines(tmp_path / 'producer-1.jsonl')
    assert hello['e'] == 'hello' and hello['role'] == 'producer' and hello['pid'] == os.getpid()
    assert 0 < hello['dt'] < 0.5
    # The server's own clock read just before and just after the event: the stamp lies between, within dt / 2.
    assert seconds + micros / 1e6 - hello['dt'] / 2 - 0.001 <= t <= after_seconds + after_micros / 1e6 + hello['dt'] / 2
    assert invoke == {'t': t, 'p': 'producer-1', 'e': 'invoke', 'op': 'producer-1:1'}
    with pytest.raises(ValueError, match='unknown event type'):
        rec.event('nonsense')
    rec.close()


def test_a_forked_child_writes_a_file_of_its_own_opened_at_its_first_event(tmp_path, address):
    rec = record.Recorder(tmp_path, 'worker-2', 'worker', addresses=address, worker='worker-2')
    rec.child('horse-2-1', 'horse', worker='worker-2')
    pid = os.fork()
    if pid == 0:  # the horse: records, then exits without running the test process's clean-up
        try:
            rec.event('start', job='j1', run='worker-2:1:1')
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    quiet = os.fork()  # a child that records nothing (a hold guard) leaves no file
    if quiet == 0:
        os._exit(0)
    os.waitpid(quiet, 0)
    rec.event('release', job='j1', claim='c1')
    assert sorted(p.name for p in tmp_path.iterdir()) == ['horse-2-1.jsonl', 'worker-2.jsonl']
    hello, start = lines(tmp_path / 'horse-2-1.jsonl')
    assert hello['p'] == 'horse-2-1' and hello['role'] == 'horse' and hello['pid'] == pid
    assert hello['worker'] == 'worker-2' and hello['dt'] == lines(tmp_path / 'worker-2.jsonl')[0]['dt']
    assert start['e'] == 'start' and start['p'] == 'horse-2-1'
    assert [e['e'] for e in lines(tmp_path / 'worker-2.jsonl')] == ['hello', 'release']
    rec.close()


def test_a_later_measurement_only_replaces_the_offset_when_it_is_as_tight(address):
    clock = record.ServerClock(address)
    assert clock.measure() and clock.dt is not None
    first = clock.dt
    clock.dt = first / 1000  # as if the first round trip had been far tighter than any later one can be
    clock.offset = 123.0
    assert clock.measure()  # the server answered...
    assert clock.offset == 123.0  # ...but too slowly to keep the bound hello reported: the offset stays
    clock.dt = 10.0
    assert clock.measure() and abs(clock.offset) < 1.0  # a tight one replaces it (same host: the offset is ~0)


def test_a_server_that_does_not_answer_keeps_the_offset_and_is_asked_again_at_most_once_a_second(tmp_path):
    from rq_policies.surfaces.testing import free_port

    clock = record.ServerClock([('127.0.0.1', free_port())])
    assert not clock.measure() and clock.offset == 0.0 and clock.dt is None
    started = time.monotonic()
    assert not clock.maybe_measure()  # within a second of the last try: not even tried
    assert time.monotonic() - started < 0.1
    record.Recorder(tmp_path, 'runner', 'runner', clock=clock).close()
    assert lines(tmp_path / 'runner.jsonl')[0]['dt'] is None  # the checker then allows its default uncertainty


def test_the_environment_names_the_folder_the_clock_and_the_topology(tmp_path, address, monkeypatch):
    monkeypatch.setenv(record.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(record.CLOCK_ENV, ','.join(f'{h}:{p}' for h, p in address))
    monkeypatch.setenv(record.TOPOLOGY_ENV, 'sentinel')
    rec = record.from_env('nemesis', 'nemesis')
    assert record.here() is rec
    rec.event('nemesis', action='kill_worker', phase='begin', id='kill_worker-1')
    hello, event = lines(tmp_path / 'nemesis.jsonl')
    assert hello['topology'] == 'sentinel' and event['action'] == 'kill_worker'
    assert record.parse_addresses('127.0.0.1:7000, :7001') == [('127.0.0.1', 7000), ('127.0.0.1', 7001)]
    rec.close()
