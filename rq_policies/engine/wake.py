"""The idle wait of a PolicyWorker: a fetcher that sleeps on pub/sub until a wake-up could make a look succeed.

Its wake-ups are published on each queue's ``rq:policies:wake:<queue>`` channel (a shard channel; see
:func:`rq_policies.engine.keys.wake`): a pushed job's id, ``released <ledger> <token>`` (a hold went back; of the idle
workers it wakes, only the first to claim it looks again), ``capacity`` (a cap changed) and ``scheduled <epoch s>``
(a job is due then: the wait ends at that time, with no look before). The subscription lives while the worker is
idle, and for the queues a busy worker leaves out of its fetches (known full, :meth:`Fetcher.fetch_queues`): their
releases and capacity changes put them back.

Sharded pub/sub, on every server. The wake-ups go out with SPUBLISH (in the doors' scripts, ``lua/lib/save_job.lua``
and the others, and from Python through :func:`rq_policies.engine.ledger.wake_up`) and the idle wait takes them with
SSUBSCRIBE, on a single server as on a cluster: one code path, the one the whole suite runs. Why sharded: on a Redis
or Valkey Cluster a classic PUBLISH is broadcast over the cluster bus to every node, so each wake-up costs every
primary and replica of the cluster something, and more nodes cost more; SPUBLISH stays on the shard that owns the
channel's slot (its primary and that primary's replicas), which with a hash-tagged prefix (``RQ_KEY_PREFIX='{rq}'``)
is the slot every key of rq and of ours is in already (docs/scaling.md has the figures: on a 3+3 cluster a wake-up
cost the cluster about 19 µs of CPU over its 6 nodes with PUBLISH, 5 µs with SPUBLISH, and the other primaries
nothing). Why everywhere rather than on a cluster only: every server rq-policies supports has it (Redis 7.0 and
later, every Valkey); on a single server SPUBLISH and SSUBSCRIBE are a channel namespace of their own that costs what
PUBLISH and SUBSCRIBE do; redis-py has them from 5.0 (``redis>=5``) and fakeredis from 2.18 (``fakeredis[lua]>=2.26``
is supported for users' tests, scripts included); and a switch would put a second path into every script that
publishes. The price: a process of this version and one of an older version (PUBLISH/SUBSCRIBE) do not hear each
other's wake-ups, during a rolling upgrade say; nothing is lost, an idle worker then finds a pushed job by its
once-a-second probe instead, and a freed hold at its next look (:meth:`Fetcher.idle`, :meth:`Fetcher.relook_seconds`).

On a cluster redis-py's ``ClusterPubSub`` opens the subscription on the primary that owns the channels' slot
(all of a worker's channels are in the prefix's slot: one node), and the wait reads that node's messages only
(``get_sharded_message(target_node=...)``). The subscription is taken anew, with one more look first, when it is
lost: the client's slot map names another owner (a failover or a slot migration the client has noticed since), the
server ended it (a slot migration sends SUNSUBSCRIBE-like ``sunsubscribe`` messages to its shard subscribers), or
redis-py dropped the node's subscription; a connection error on the subscription (its node died) closes it and is
raised to rq's worker loop, which backs off and fetches again, as with any connection error, and the next idle wait
subscribes on the owner of then. An SSUBSCRIBE the server answers with an error (``MOVED`` from a node the slot has
left before the client's map knew, ``NOPERM`` under an ACL without the channels) is not raised: the worker looks
again (which refreshes a cluster client's map), polls for IDLE_POLL_SECONDS, then subscribes anew. No worker restart
is needed in any of these.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from redis.exceptions import ResponseError

from . import keys, ledger
from .fetch import IDLE_POLL_SECONDS, Claim, Fetcher
from .ledger import WAKE_CAPACITY, WAKE_RELEASED, WAKE_SCHEDULED
from .ops import text

logger = logging.getLogger('rq_policies')

#: How long the idle wait waits for the server to confirm a subscription before looking again anyway (seconds).
_SUBSCRIBE_CONFIRM_SECONDS = 1.0


#: The message types of a wake-up (SPUBLISH delivers ``smessage``), of a subscription's confirmation, and of its end.
_WAKE_UP = 'smessage'
_SUBSCRIBED = 'ssubscribe'
_UNSUBSCRIBED = 'sunsubscribe'


class _Lost(Exception):
    """The subscription is gone (see :class:`WakeFetcher`): take it anew after one more look."""


class _Refused(Exception):
    """The server answered the subscription with an error (see :meth:`WakeFetcher._refused`)."""


class WakeFetcher(Fetcher):
    """A worker's fetch state, with a sharded pub/sub wake-up for the idle wait (see the module's docstring).

    The subscription lives while the worker is idle: it is dropped when a job is claimed, so a busy worker's
    connection does not pile up wake-ups for the length of a long job, but for the channels of the queues the
    worker leaves out of its fetches (known full: :meth:`hear`, :meth:`check_news`), whose news it reads without
    waiting before each fetch. Taking it again before the next wait costs one round trip plus one more look, and
    closes the race between the last look and the subscription.
    """

    def __init__(self, hold_ttl: int) -> None:
        super().__init__()
        self.hold_ttl = hold_ttl
        self._pubsub: Any = None
        self._channels: dict[str, str] = {}  # subscribed channel -> queue name
        self._node: Any = None  # on a cluster: the node (redis-py's ClusterNode) the subscription is on
        self._refused_until = 0.0  # after a refused subscription: polled until then (monotonic seconds)
        self._confirmed: set[str] = set()  # the subscribed channels whose SSUBSCRIBE the server confirmed
        self._pending: set[str] = set()  # queues heard of since the last fetch, not yet left out (see hear())

    def listen(self, connection: Any, queue_names: list[str]) -> bool:
        wanted = {keys.wake(name): name for name in queue_names}
        if self._pubsub is not None and wanted == self._channels:
            return False
        if self._pubsub is None and time.monotonic() < self._refused_until:
            return False  # the wait polls a moment (see _refused)
        try:
            if self._pubsub is None:
                self._pubsub = connection.pubsub()
            # The channels kept while busy (those of the queues left out of the fetches, see on_claim) stay.
            stale = [channel for channel in self._channels if channel not in wanted]
            if stale:
                self._pubsub.sunsubscribe(*stale)
            new = [channel for channel in wanted if channel not in self._channels]
            if new:
                self._pubsub.ssubscribe(*new)
            self._confirmed &= self._channels.keys() & wanted.keys()
            self._channels = wanted
            # On a cluster every channel of ours is in the prefix's slot: ClusterPubSub subscribed on its owner.
            self._node = connection.get_node_from_key(next(iter(wanted))) if keys.is_cluster(connection) else None
            # Wait for the server's confirmations: a wake-up is only delivered once SSUBSCRIBE has run.
            confirmed = self._confirmed
            deadline = time.monotonic() + _SUBSCRIBE_CONFIRM_SECONDS
            while not confirmed >= wanted.keys():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                message = self._read(left)
                if message is not None and message['type'] == _SUBSCRIBED:
                    confirmed.add(text(message['channel']))
        except (_Refused, _Lost) as refused:
            # _Lost: the subscription went while it was being confirmed (on a cluster, the prefix's slot moved to
            # another primary: the new channels were subscribed where the slot went, the old ones stayed on the old
            # owner). Raised from here it reached rq's work loop, which quit (exit code 0: the cluster history run on
            # befa209 lost 3 workers so). Given up as a refused one is: polled a moment, then taken anew.
            self._refused(refused)
        except Exception:
            self.close()
            raise
        return True

    def hearing(self) -> frozenset[str]:
        """The queues whose wake-up channels are subscribed, confirmed by the server."""
        return frozenset(queue for channel, queue in self._channels.items() if channel in self._confirmed)

    def check_news(self, connection: Any) -> None:
        """Read the wake-ups that came since the last fetch, without waiting: a release or a capacity change on a
        queue left out of the fetches (:attr:`skip`) puts it back. Pushes are no news here (the queues not left out
        are all looked at). Any trouble with the subscription drops it, and every queue is looked at again."""
        if self._pubsub is None or not self._channels:
            return
        try:
            self._drain(set())
        except Exception as error:  # _Lost, _Refused, a connection error: the subscription goes, no skip stays
            logger.info('rq-policies: the wake-up subscription of the full queues is gone (%s)', error)
            self.close()

    def hear(self, connection: Any, queue_names: list[str]) -> None:
        """Subscribe the wake-up channels of ``queue_names`` too, while the worker is busy (their queues were found
        full: a fetch after this one that finds them full again leaves them out, :meth:`Fetcher.saw`), and wait for
        the server's confirmation. Never raises: the fetch before it may have taken a job."""
        self._pending = set(queue_names)
        wanted = {keys.wake(name): name for name in queue_names if keys.wake(name) not in self._channels}
        if not wanted or (self._pubsub is None and time.monotonic() < self._refused_until):
            return
        try:
            if self._pubsub is None:
                self._pubsub = connection.pubsub()
            self._pubsub.ssubscribe(*wanted)
            self._channels.update(wanted)
            if self._node is None and keys.is_cluster(connection):
                self._node = connection.get_node_from_key(next(iter(wanted)))
            self._drain(set(wanted))
        except _Refused as refused:
            self._refused(refused)
        except Exception as error:
            logger.info('rq-policies: could not subscribe the wake-ups of full queues (%s); looking at them', error)
            self.close()

    def _drain(self, expect: set[str]) -> None:
        """Read the subscription's messages: all that came (without waiting), and until the confirmations of the
        channels in ``expect`` came (up to _SUBSCRIBE_CONFIRM_SECONDS). A release or a capacity change unskips its
        queue; a subscription the server ended raises _Lost."""
        deadline = time.monotonic() + _SUBSCRIBE_CONFIRM_SECONDS
        while True:
            left = deadline - time.monotonic() if expect else 0.0
            if expect and left <= 0:
                return
            message = self._read(max(left, 0.0))
            if message is None:
                if not expect:
                    return
                continue
            channel = text(message['channel'])
            if message['type'] == _SUBSCRIBED:
                expect.discard(channel)
                self._confirmed.add(channel)
            elif self._ended(message) and channel not in expect:  # not an earlier unsubscription's answer
                raise _Lost(f'the server ended the subscription to {channel}')
            elif message['type'] == _WAKE_UP and channel in self._channels:
                if text(message['data']).split(' ', 1)[0] in (WAKE_RELEASED, WAKE_CAPACITY):
                    self.unskip(self._channels[channel])

    def wait(self, connection: Any, queue_names: list[str], seconds: float, full: frozenset[str] = frozenset()) -> bool:
        if self._pubsub is None:
            self.listen(connection, queue_names)
            if self._pubsub is None:  # refused a moment ago: poll
                return super().wait(connection, queue_names, seconds, full)
        deadline = time.monotonic() + min(seconds, IDLE_POLL_SECONDS)
        try:
            self._check_owner(connection)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                message = self._read(left)
                if message is not None and self._ended(message):
                    raise _Lost(f'the server ended the subscription to {text(message["channel"])}')
                if message is not None and self._scheduled(connection, message):
                    deadline = min(deadline, time.monotonic() + max(self.due_at - self.server_now(connection), 0.0))
                    continue
                if message is not None and self._news(message, full) and self._first(connection, message):
                    return True
        except _Lost as lost:
            # Looked at again at once: a wake-up published since the subscription ended was not heard.
            logger.info('rq-policies: the idle wake-up subscription was lost (%s); subscribing anew', lost)
            self.close()
            return True
        except _Refused as refused:
            self._refused(refused)
            return True
        except Exception:
            self.close()
            raise

    def _refused(self, error: Exception) -> None:
        """The server answered the subscription with an error: on a cluster, MOVED from a node that no longer owns
        the slot (the client's map is older than a slot migration). The caller looks again, which meets the same
        MOVED and refreshes the client's map; the idle wait polls until IDLE_POLL_SECONDS from now, then subscribes
        anew (at most one refused subscription a second, never a worker stopped for it)."""
        logger.warning('rq-policies: the idle wake-up subscription was refused or lost as it was taken (%s); polling '
                       'for %s s, then subscribing anew', error, IDLE_POLL_SECONDS)
        self.close()
        self._refused_until = time.monotonic() + IDLE_POLL_SECONDS

    def _read(self, timeout: float) -> dict | None:
        """The next message of the subscription, waiting up to ``timeout`` seconds (None when none came)."""
        try:
            if self._node is None:
                return self._pubsub.get_message(timeout=timeout)
            # A ClusterPubSub keeps one subscription per node: read the node ours is on, waiting there (without a
            # target it polls each node's once, and redis-py 5.0 waits on none of them).
            if self._node.name not in self._pubsub.node_pubsub_mapping:
                raise _Lost(f'redis-py dropped the subscription on {self._node.name}')
            return self._pubsub.get_sharded_message(timeout=timeout, target_node=self._node)
        except ResponseError as error:  # an error reply read from the subscription's connection
            raise _Refused(str(error)) from error

    def _check_owner(self, connection: Any) -> None:
        """On a cluster: does the node the subscription is on still own the channels' slot, as far as the client
        knows (its slot map follows a failover or a slot migration at the first command that meets it)?"""
        if self._node is None or not self._channels:
            return
        try:
            owner = connection.get_node_from_key(next(iter(self._channels)))
        except Exception as error:  # the slot uncovered in the client's map, mid-failover: the look tells
            raise _Lost(f'no owner of the channels is known ({error})') from error
        if owner.name != self._node.name:
            raise _Lost(f'the channels moved from {self._node.name} to {owner.name}')

    def _ended(self, message: dict) -> bool:
        """Did the server end the subscription to one of our channels? (A slot migration does: the old owner sends
        ``sunsubscribe`` to its shard subscribers. Ours, on a claim, are read at the next listen().)"""
        return message['type'] == _UNSUBSCRIBED and text(message['channel']) in self._channels

    def _scheduled(self, connection: Any, message: dict) -> bool:
        """A ``scheduled <time>`` wake-up (PolicyQueue scheduled a job of one of these queues): noted, so the wait
        ends at its due time (server clock); nothing to look at before."""
        if message['type'] != _WAKE_UP or text(message['channel']) not in self._channels:
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
        if message['type'] != _WAKE_UP:
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
            # The channels of the queues left out of the fetches, or about to be (Fetcher.saw), stay subscribed:
            # their releases put them back. The others go: a busy worker does not pile up pushes.
            keep = {channel for channel, queue in self._channels.items()
                    if queue in self.skip or queue in self._pending}
            drop = [channel for channel in self._channels if channel not in keep]
            if not drop:
                return
            try:
                # the confirmations are read, and skipped, at the next listen() or fetch
                self._pubsub.sunsubscribe(*drop) if keep else self._pubsub.sunsubscribe()
            except Exception:  # the subscription is dropped whole instead; the next idle wait subscribes anew
                logger.warning(
                    'rq-policies: could not unsubscribe the idle wake-up; closing its connection', exc_info=True)
                self.close()
                return
            for channel in drop:
                del self._channels[channel]
                self._confirmed.discard(channel)

    def close(self) -> None:
        if self._pubsub is not None:
            try:
                self._pubsub.close()
            finally:
                self._pubsub = None
                self._channels = {}
                self._confirmed = set()
                self._node = None
        self.forget_full()  # nothing heard of any more: every queue is looked at again
