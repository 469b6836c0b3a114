"""The job functions of the quickstart; workers import them by path, so they live in a module of their own."""

from rq_policies import Loner, policy


@policy(Loner())
def sweep_cache(article_id: int) -> str:
    return f'cache of article {article_id} refreshed'
