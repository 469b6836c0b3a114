"""The README stays a short front page, and the docs site covers the public API.

The site itself is built by CI (`.ci/run`: ``mkdocs build --strict``, which fails on a broken link or anchor, a page
left out of the navigation or a docstring that does not render); these checks need no docs toolchain.
"""

from __future__ import annotations

import ast
import re

import rq_policies
from tests.helpers import ROOT

README = ROOT / 'README.md'
DOCS = ROOT / 'docs'

#: The README's two commands, run as they are written (CI runs the second on every matrix cell).
QUICKSTART = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[embedded]' && python examples/quickstart.py"
)
TESTS = "python3 -m venv .venv && . .venv/bin/activate && pip install -e '.[dev]' && python -m pytest"
MAX_WORDS = 1500


def readme() -> str:
    return README.read_text(encoding='utf-8')


def fenced_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf'^```{language}\n(.*?)^```$', text, flags=re.S | re.M)


def test_readme_is_at_most_1500_words():
    words = len(readme().split())  # what `wc -w` counts
    assert words <= MAX_WORDS, f'README.md has {words} words (at most {MAX_WORDS}): move the detail into docs/'


def test_readme_starts_with_the_two_commands():
    """Before the first section: the quickstart, then the test command, as the first two code lines."""
    head = readme().split('\n## ', 1)[0]
    commands = [line[4:] for line in head.splitlines() if line.startswith('    ') and line.strip()]
    assert commands[:2] == [QUICKSTART, TESTS], commands
    assert '```' not in head, 'no other code before the two commands'


def test_the_docs_give_the_same_commands():
    for page in ('index.md', 'development.md'):
        text = (DOCS / page).read_text(encoding='utf-8')
        assert f'    {TESTS}\n' in text, page
    assert f'    {QUICKSTART}\n' in (DOCS / 'index.md').read_text(encoding='utf-8')


def test_readme_has_a_running_workers_paragraph():
    text = readme()
    assert '## Running workers' in text
    assert '<!-- Running workers' in text and '<!-- /Running workers -->' in text
    assert 'rq_policies.PolicyWorker' in text


def test_readme_tours_every_policy_and_tool():
    text = readme()
    for name in ('Loner', 'Throttle', 'Debounce', 'QueueSlot', 'QueueRate', 'Concurrency', 'Rate',
                 'LimitedCapacityWorker', 'rq-policies', 'dashboard', 'explain'):
        assert name in text, name


def test_readme_python_examples_compile_and_import_what_exists():
    blocks = fenced_blocks(readme(), 'python')
    assert blocks
    for block in blocks:
        tree = ast.parse(block)  # a SyntaxError names the line
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == 'rq_policies':
                for alias in node.names:
                    assert alias.name in rq_policies.__all__, f'README imports {alias.name} from rq_policies'


def test_readme_links_to_files_that_exist():
    for target in re.findall(r'\]\(([^)#]+)(?:#[^)]*)?\)', readme()):
        if '://' in target:
            continue
        assert (ROOT / target).exists(), f'README links to {target}, which does not exist'


def test_api_reference_documents_every_exported_name():
    page = (DOCS / 'api.md').read_text(encoding='utf-8')
    documented = {name.rsplit('.', 1)[-1] for name in re.findall(r'^::: (rq_policies\.[\w.]+)$', page, flags=re.M)}
    missing = sorted(set(rq_policies.__all__) - documented)
    assert not missing, f'docs/api.md lacks {missing}'


def test_every_docs_page_is_in_the_nav():
    """mkdocs --strict says so too (omitted_files); this check needs no mkdocs."""
    config = (ROOT / 'mkdocs.yml').read_text(encoding='utf-8')
    section = re.search(r'^nav:\n((?:[ \t].*\n|\n)*)', config, flags=re.M)
    assert section, 'mkdocs.yml has no nav'
    nav = set(re.findall(r'^\s+- (?:[^:\n]+: )?([\w./-]+\.md)$', section.group(1), flags=re.M))
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob('*.md')}
    assert pages == nav, f'not in the nav: {sorted(pages - nav)}; in the nav but missing: {sorted(nav - pages)}'


def test_the_documented_acl_is_the_tested_one():
    from tests.helpers.acl import ACL_RULES

    text = (DOCS / 'acl.md').read_text(encoding='utf-8')
    match = re.search(r'^    ACL SETUSER rq (.*?)\n\n', text, flags=re.S | re.M)
    assert match, 'docs/acl.md shows the ACL as an indented ACL SETUSER rq ... block'
    rules = match.group(1).split()
    assert rules == ['>PASSWORD' if rule == '>s3cret' else rule for rule in ACL_RULES]
