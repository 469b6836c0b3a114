"""rq-policies: flow-control policies for RQ (unique jobs, throttle, debounce, cluster-wide queue caps)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .engine import __version__ as __version__
from .engine.admin import Cap, KeyLimit, KeyRate, KeyStatus, RateWindow, SlotStatus
from .engine.exceptions import (
    DuplicateJob,
    InvalidArgument,
    InvalidSetting,
    NotReplicated,
    PipelineNotSupported,
    PolicyConfigurationError,
    PolicyError,
    UnknownQueueWarning,
)
from .engine.job import PolicyJob
from .engine.keyed import Tiers
from .engine.policy import AdmissionPolicy, DroppedCall, FetchPolicy, Policy, PolicySet, policy
from .engine.queue import PolicyQueue
from .engine.worker import PolicySimpleWorker, PolicyWorker
from .policies.batch.rules import Batch, batch_of
from .policies.concurrency.rules import Concurrency
from .policies.debounce.rules import Debounce
from .policies.fair.rules import Fair
from .policies.limited_capacity.rules import LimitedCapacityWorker
from .policies.loner.rules import Loner
from .policies.queue_rate.rules import BackOff, QueueRate, RateStatus, Snooze, SnoozeLimitReached
from .policies.queue_slot.rules import QueueSlot
from .policies.rate.rules import Rate
from .policies.throttle.rules import Outcome, Throttle

if TYPE_CHECKING:
    from .surfaces.explainer import UnknownJob, explain

__all__ = [
    'AdmissionPolicy',
    'BackOff',
    'Batch',
    'Cap',
    'Concurrency',
    'Debounce',
    'DroppedCall',
    'DuplicateJob',
    'Fair',
    'FetchPolicy',
    'InvalidArgument',
    'InvalidSetting',
    'KeyLimit',
    'KeyRate',
    'KeyStatus',
    'LimitedCapacityWorker',
    'Loner',
    'NotReplicated',
    'Outcome',
    'PipelineNotSupported',
    'Policy',
    'PolicyConfigurationError',
    'PolicyError',
    'PolicyJob',
    'PolicyQueue',
    'PolicySet',
    'PolicySimpleWorker',
    'PolicyWorker',
    'QueueRate',
    'QueueSlot',
    'Rate',
    'RateStatus',
    'RateWindow',
    'SlotStatus',
    'Snooze',
    'SnoozeLimitReached',
    'Throttle',
    'Tiers',
    'UnknownJob',
    'UnknownQueueWarning',
    'batch_of',
    'explain',
    'policy',
]


def __getattr__(name: str) -> Any:
    """``explain`` and ``UnknownJob``, imported at their first lookup: the explainer reads the policies' views, which a
    worker and a producer never need (importing them cost a worker's start about 8 ms, issue 33)."""
    if name in ('explain', 'UnknownJob'):
        from .surfaces import explainer

        return getattr(explainer, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
