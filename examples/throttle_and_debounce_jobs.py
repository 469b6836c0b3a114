"""The job functions of examples/throttle_and_debounce.py; workers import them by path, so they live apart."""

from rq_policies import Debounce, Throttle, policy


@policy(Throttle(2))  # at most one poll per account per 2-second slot (think: Throttle(60) for once a minute)
def poll_account(account_id: int) -> str:
    return f'polled account {account_id}'


@policy(Throttle(2, trailing=True), unique_context=lambda args, kwargs: args[0])  # one identity per task
def publish_progress(task_id: int, percent: int) -> str:
    return f'task {task_id} is {percent}% done'


@policy(Debounce(1, max_wait=5), unique_context=lambda args, kwargs: args[0])  # one identity per document
def reindex(doc_id: int, version: int) -> str:
    return f'document {doc_id} reindexed at version {version}'
