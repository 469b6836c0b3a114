"""rq_policies.ledger: the one hold type, and the Keeper thread every hold owner without a heartbeat uses."""

from __future__ import annotations

import time

from redis import Redis

from rq_policies import keys
from rq_policies.ledger import Hold, Keeper, Ledger, acquire_call


def server_now(conn: Redis) -> float:
    seconds, micros = conn.time()
    return seconds + micros / 1e6


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_ledger_acquires_refreshes_and_forgets_what_lapsed(connection):
    a, b = Hold(keys.holds('l'), 'a', 30), Hold(keys.holds('l'), 'b', 30)
    held = Ledger()
    assert held.acquire(connection, a, capacity=1) is True
    assert held.acquire(connection, b, capacity=1) is False  # at capacity: not this owner's
    assert held.holds() == [a]
    connection.zadd(a.ledger, {'a': server_now(connection) - 1})  # lapsed (a stall longer than its ttl)
    assert held.refresh(connection) == [a]
    assert held.holds() == []  # forgotten: refreshing it again could only fail
    assert connection.zscore(a.ledger, 'a') < server_now(connection)  # and never revived
    assert acquire_call(b, 1).run(connection) == 1  # its capacity is someone else's now
    held.release(connection, a)
    assert connection.zrange(a.ledger, 0, -1) == [b'b']  # a late release names its own hold only


def test_keeper_refreshes_while_active_and_stops_once_its_holds_lapsed(connection):
    hold = Hold(keys.holds('keep'), 'k', 2)
    held = Ledger([hold])
    assert acquire_call(hold, 1).run(connection) == 1
    active = {'now': False}
    keeper = Keeper(connection, held, 0.2, tick=0.05, active=lambda: active['now'], until_empty=True).start()
    try:
        first = connection.zscore(hold.ledger, 'k')
        time.sleep(0.5)
        assert connection.zscore(hold.ledger, 'k') == first  # inactive: not refreshed (someone else does it)
        active['now'] = True
        assert wait_for(lambda: connection.zscore(hold.ledger, 'k') > first)
        connection.zadd(hold.ledger, {'k': server_now(connection) - 1})
        assert wait_for(lambda: not keeper._thread.is_alive())  # its one hold lapsed: nothing left to keep
        assert held.holds() == []
        assert connection.zscore(hold.ledger, 'k') < server_now(connection)
    finally:
        keeper.stop()
