"""``python -m rq_policies ARGS``: the ``rq-policies`` command, without its console script."""

from rq_policies.surfaces.cli import cli

cli()
