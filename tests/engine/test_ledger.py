"""rq_policies.ledger: the one hold type, and the Keeper every hold owner without a heartbeat uses."""

from __future__ import annotations

import time

import pytest

from rq_policies.engine import keys
from rq_policies.engine.ledger import Hold, Keeper, Ledger, acquire_call
from tests.helpers.records import server_now
from tests.helpers.workers import wait_for


def test_ledger_acquires_refreshes_and_re_adds_what_lapsed_under_its_job(connection):
    a, b = Hold(keys.holds('l'), 'a', 30), Hold(keys.holds('l'), 'b', 30)
    held = Ledger()
    assert held.acquire(connection, a, capacity=1) is True
    assert held.acquire(connection, b, capacity=1) is False  # at capacity: not this owner's
    assert held.holds() == [a]
    connection.zadd(a.ledger, {'a': server_now(connection) - 1})  # lapsed (a stall longer than its ttl)
    assert acquire_call(b, 1).run(connection) == 1  # meanwhile its capacity went to someone else
    assert held.refresh(connection) == [a]  # reported lapsed...
    assert held.holds() == [a]  # ...still this owner's: its job runs
    assert connection.zscore(a.ledger, 'a') > server_now(connection) + 29  # and counted again
    assert acquire_call(Hold(a.ledger, 'c', 30), 1).run(connection) == 0  # two run on a cap of 1: nobody else
    assert connection.hget(keys.LAPSES, 'queue:l') == b'1'
    assert held.refresh(connection) == []  # live again
    held.release(connection, a)
    assert connection.zrange(a.ledger, 0, -1) == [b'b']  # a release names its own hold only


class Log:
    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, message: str, *args, **kwargs) -> None:
        self.warnings.append(message % args)


@pytest.mark.parametrize('process', [True, False], ids=['process', 'thread'])
def test_keeper_refreshes_while_active_re_adds_a_lapsed_hold_and_stops_once_released(connection, tmp_path, process):
    hold = Hold(keys.holds('keep'), 'k', 2, job='job-1')
    held = Ledger([hold])
    assert acquire_call(hold, 1).run(connection) == 1
    flag = tmp_path / 'active'  # seen by a keeper process too
    log = Log()
    keeper = Keeper(connection, held, 0.2, tick=0.05, active=flag.exists, until_empty=True, log=log, process=process)
    keeper.start()
    try:
        assert keeper.alive()
        first = connection.zscore(hold.ledger, 'k')
        time.sleep(0.5)
        assert connection.zscore(hold.ledger, 'k') == first  # inactive: not refreshed (someone else does it)
        flag.touch()
        assert wait_for(lambda: connection.zscore(hold.ledger, 'k') > first)
        connection.zrem(hold.ledger, 'k')  # gone under a running job
        assert wait_for(lambda: connection.zscore(hold.ledger, 'k') is not None)  # counted again
        assert connection.hget(keys.LAPSES, 'queue:keep') == b'1'
        if not process:  # a keeper process logs to its own copy of the logger
            assert wait_for(lambda: log.warnings)
            assert 'queue:keep' in log.warnings[0] and 'job-1' in log.warnings[0] and 'holder k' in log.warnings[0]
        keeper.stop()
        assert not keeper.alive()
        held.release(connection, hold)
        time.sleep(0.5)
        assert connection.zscore(hold.ledger, 'k') is None  # nothing refreshes it after the stop
    finally:
        keeper.stop()
