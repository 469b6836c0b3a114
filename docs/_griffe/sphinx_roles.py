"""A Griffe extension the docs build loads (mkdocs.yml): the docstrings' Sphinx cross-reference roles
(``:class:`~rq_policies.Fair```, ``:meth:`pause```) and literal-block markers (``Example::``) as the API page can
show them. mkdocstrings renders docstrings as Markdown, where a role stays raw text (``:class:`` and a code span);
here each becomes a code span that links to the object when the site documents it (an optional cross-reference of
mkdocs-autorefs: unresolved, it is the code span alone), and ``Example::`` with its indented block a fenced block.

The docstrings keep the roles (help(), IDEs and the source read them as they are). ``tests/engine/test_docs_roles.py``
runs every docstring of the package through this and fails on a role left raw; CI's docs step (``.ci/run``) greps the
built site for one."""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

#: ``:class:`target```, ``:meth:`~target```, ``:func:`title <target>```, optionally ``:py:`` prefixed.
ROLE = re.compile(r':(?:py:)?(class|meth|func|data|mod|attr|exc|obj|const):`(~?)([^`<]+?)(?:\s*<([^>`]+)>)?`')
#: A line ending a paragraph with ``::`` (reStructuredText's "a literal block follows").
LITERAL = re.compile(r'^(\s*)(\S.*?)::\s*$')


def _context(obj: Any) -> str:
    """The path a bare name in ``obj``'s docstring is looked up under: its class, else its module."""
    if obj.kind is griffe.Kind.CLASS or obj.kind is griffe.Kind.MODULE:
        return obj.path
    parent = obj.parent
    return parent.path if parent is not None else obj.path


def roles(text: str, context: str) -> str:
    """``text`` with every Sphinx role as an optional cross-reference around a code span."""

    def one(match: re.Match[str]) -> str:
        role, short, target, explicit = match.groups()
        if explicit:
            shown, target = target.strip(), explicit.strip()
        else:
            target = target.strip()
            shown = target.rsplit('.', 1)[-1] if short else target
        if role in ('meth', 'func') and not explicit and not shown.endswith(')'):
            shown += '()'
        identifier = target.lstrip('.')
        if '.' not in identifier and context:
            identifier = f'{context}.{identifier}'
        return (f'<autoref identifier="{html.escape(identifier)}" optional><code>{html.escape(shown)}</code>'
                '</autoref>')

    return ROLE.sub(one, text)


def literal_blocks(text: str) -> str:
    """Each ``Para::`` and the indented block after it as ``Para:`` and a fenced Python block."""
    lines = text.split('\n')
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = LITERAL.match(lines[i])
        if match is None:
            out.append(lines[i])
            i += 1
            continue
        indent, words = match.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        block: list[str] = []
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > len(indent)):
            block.append(lines[j])
            j += 1
        while block and not block[-1].strip():
            block.pop()
        if not block:
            out.append(f'{indent}{words}:')
            i += 1
            continue
        depth = min(len(line) - len(line.lstrip()) for line in block if line.strip())
        out += [f'{indent}{words}:', '', f'{indent}```python']
        out += [indent + line[depth:] if line.strip() else '' for line in block]
        out += [f'{indent}```', '']
        i = j
    return '\n'.join(out)


class SphinxRoles(griffe.Extension):
    """Rewrite each loaded object's docstring for the API page (see the module)."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        docstring = getattr(obj, 'docstring', None)
        if docstring is None or not docstring.value:
            return
        docstring.value = roles(literal_blocks(docstring.value), _context(obj))
