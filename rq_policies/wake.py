"""The idle wait of a PolicyWorker: a fetcher that sleeps on pub/sub until a wake-up could make a look succeed.

Its wake-ups are published on each queue's ``rq:policies:wake:<queue>`` channel (a pub/sub channel; see
:func:`rq_policies.keys.wake`): a pushed job's id, ``released <ledger> <token>`` (a hold went back; of the idle
workers it wakes, only the first to claim it looks again), ``capacity`` (a cap changed) and ``scheduled <epoch s>``
(a job is due then: the wait ends at that time, with no look before). The subscription lives only while the worker
is idle.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from . import keys, ledger
from .fetch import IDLE_POLL_SECONDS, Claim, Fetcher
from .ledger import WAKE_CAPACITY, WAKE_RELEASED, WAKE_SCHEDULED
from .ops import text

logger = logging.getLogger('rq_policies')

#: How long the idle wait waits for the server to confirm a subscription before looking again anyway (seconds).
_SUBSCRIBE_CONFIRM_SECONDS = 1.0


class WakeFetcher(Fetcher):
    """A worker's fetch state, with a pub/sub wake-up for the idle wait.

    The subscription lives only while the worker is idle: it is dropped when a job is claimed, so a busy worker's
    connection does not pile up wake-ups for the length of a long job. Taking it again before the next wait costs
    one round trip plus one more look, and closes the race between the last look and the subscription.
    """

    def __init__(self, hold_ttl: int) -> None:
        super().__init__()
        self.hold_ttl = hold_ttl
        self._pubsub: Any = None
        self._channels: dict[str, str] = {}  # subscribed channel -> queue name

    def listen(self, connection: Any, queue_names: list[str]) -> bool:
        wanted = {keys.wake(name): name for name in queue_names}
        if self._pubsub is not None and wanted == self._channels:
            return False
        try:
            if self._pubsub is None:
                self._pubsub = connection.pubsub()
            elif self._channels:
                self._pubsub.unsubscribe(*self._channels)
            self._pubsub.subscribe(*wanted)
            self._channels = wanted
            # Wait for the server's confirmations: a wake-up is only delivered once SUBSCRIBE has run.
            confirmed: set[str] = set()
            deadline = time.monotonic() + _SUBSCRIBE_CONFIRM_SECONDS
            while len(confirmed) < len(wanted):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                message = self._pubsub.get_message(timeout=left)
                if message is not None and message['type'] == 'subscribe':
                    confirmed.add(text(message['channel']))
        except Exception:
            self.close()
            raise
        return True

    def wait(self, connection: Any, queue_names: list[str], seconds: float, full: frozenset[str] = frozenset()) -> bool:
        if self._pubsub is None:
            self.listen(connection, queue_names)
        deadline = time.monotonic() + min(seconds, IDLE_POLL_SECONDS)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                message = self._pubsub.get_message(timeout=left)
                if message is not None and self._scheduled(connection, message):
                    deadline = min(deadline, time.monotonic() + max(self.due_at - self.server_now(connection), 0.0))
                    continue
                if message is not None and self._news(message, full) and self._first(connection, message):
                    return True
        except Exception:
            self.close()
            raise

    def _scheduled(self, connection: Any, message: dict) -> bool:
        """A ``scheduled <time>`` wake-up (PolicyQueue scheduled a job of one of these queues): noted, so the wait
        ends at its due time (server clock); nothing to look at before."""
        if message['type'] != 'message' or text(message['channel']) not in self._channels:
            return False
        head, _, at = text(message['data']).partition(' ')
        if head != WAKE_SCHEDULED:
            return False
        try:
            self.note_due(float(at))
        except ValueError:
            return False
        return self.due_at is not None

    def _news(self, message: dict, full: frozenset[str]) -> bool:
        """Could this message make the next look succeed? A push to a queue that is full cannot."""
        if message['type'] != 'message':
            return False
        queue = self._channels.get(text(message['channel']))
        if queue is None:
            return False  # left over from an earlier subscription
        data = text(message['data'])
        return data.split(' ', 1)[0] in (WAKE_RELEASED, WAKE_CAPACITY) or queue not in full

    @staticmethod
    def _first(connection: Any, message: dict) -> bool:
        """Of the idle workers a release woke, only the first to claim it looks again (one freed hold, one look);
        the others go back to waiting after that one SET. Any other news is everyone's."""
        data = text(message['data'])
        if data.split(' ', 1)[0] != WAKE_RELEASED:
            return True
        return ledger.woken(connection, data)

    def on_claim(self, claim: Claim) -> None:
        super().on_claim(claim)
        if self._pubsub is not None and self._channels:
            try:
                self._pubsub.unsubscribe()  # the confirmations are read, and skipped, at the next listen()
            except Exception:  # the subscription is dropped whole instead; the next idle wait subscribes anew
                logger.warning(
                    'rq-policies: could not unsubscribe the idle wake-up; closing its connection', exc_info=True)
                self.close()
            self._channels = {}

    def close(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            finally:
                self._pubsub = None
                self._channels = {}
