"""The API page shows no raw Sphinx role (issue 33): every docstring of the package, as the docs build loads it
(Griffe, with docs/_griffe/sphinx_roles.py), has its ``:class:`X``` roles and ``Example::`` markers turned into
Markdown the page renders. CI's docs step also greps the built site (.ci/run)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

griffe = pytest.importorskip('griffe')

ROOT = Path(__file__).resolve().parents[2]
RAW = re.compile(r':(?:py:)?(class|meth|func|data|mod|attr|exc|obj|const|ref):`|^\s*\S.*::\s*$', re.MULTILINE)


def _extension():
    spec = importlib.util.spec_from_file_location('sphinx_roles', ROOT / 'docs' / '_griffe' / 'sphinx_roles.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _docstrings(package):
    seen = set()

    def walk(obj):
        if obj.path in seen:
            return
        seen.add(obj.path)
        if obj.docstring is not None:
            yield obj.path, obj.docstring.value
        for member in obj.members.values():
            if not member.is_alias:
                yield from walk(member)

    yield from walk(package)


def test_no_docstring_keeps_a_sphinx_role_or_a_literal_block_marker():
    roles = _extension()
    extensions = griffe.load_extensions(roles.SphinxRoles())
    package = griffe.load('rq_policies', search_paths=[str(ROOT)], extensions=extensions)
    left = [(path, match.group(0)) for path, text in _docstrings(package) for match in RAW.finditer(text)]
    assert left == []
    # ... and without the extension there were some (the test can fail).
    plain = griffe.load('rq_policies', search_paths=[str(ROOT)])
    assert sum(len(RAW.findall(text)) for _, text in _docstrings(plain)) > 50


def test_a_role_becomes_a_code_span_linked_when_the_site_has_it_and_a_literal_block_a_fenced_one():
    roles = _extension()
    out = roles.roles('See :class:`~rq_policies.engine.exceptions.InvalidArgument`, :meth:`pause` and '
                      ':func:`the door <rq_policies.PolicyQueue.enqueue>`.', 'rq_policies.Fair')
    assert out == ('See <autoref identifier="rq_policies.engine.exceptions.InvalidArgument" optional>'
                   '<code>InvalidArgument</code></autoref>, <autoref identifier="rq_policies.Fair.pause" optional>'
                   '<code>pause()</code></autoref> and <autoref identifier="rq_policies.PolicyQueue.enqueue" optional>'
                   '<code>the door</code></autoref>.')
    text = 'Declare it.\n\nExample::\n\n    @policy(Loner())\n    def f(): ...\n\nArgs:\n    x: y.'
    assert roles.literal_blocks(text) == ('Declare it.\n\nExample:\n\n```python\n@policy(Loner())\ndef f(): ...\n'
                                          '```\n\nArgs:\n    x: y.')
