"""rq-policies: flow-control policies for RQ (unique jobs, throttle, debounce, cluster-wide queue caps)."""

from __future__ import annotations

from .admin import Cap, KeyLimit, KeyRate, KeyStatus, SlotStatus
from .concurrency import Concurrency
from .debounce import Debounce
from .exceptions import (
    DuplicateJob,
    InvalidArgument,
    InvalidSetting,
    PipelineNotSupported,
    PolicyConfigurationError,
    PolicyError,
    UnknownQueueWarning,
)
from .explainer import UnknownJob, explain
from .fair import Fair
from .job import PolicyJob
from .key_rate import Rate
from .limited_capacity import LimitedCapacityWorker
from .loner import Loner
from .policy import AdmissionPolicy, DroppedCall, FetchPolicy, Policy, PolicySet, policy
from .queue import PolicyQueue
from .queue_rate import BackOff, QueueRate, RateStatus, Snooze, SnoozeLimitReached
from .queue_slot import QueueSlot
from .throttle import Outcome, Throttle
from .worker import PolicySimpleWorker, PolicyWorker

__version__ = '0.1.0'

__all__ = [
    'AdmissionPolicy',
    'BackOff',
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
    'SlotStatus',
    'Snooze',
    'SnoozeLimitReached',
    'Throttle',
    'UnknownJob',
    'UnknownQueueWarning',
    'explain',
    'policy',
]
