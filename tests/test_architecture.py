"""The structure the policy engine promises, checked: no import cycle, and glue that names no policy."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rq_policies.policy import registered

PACKAGE = Path(__file__).resolve().parent.parent / 'rq_policies'
GLUE = ('queue.py', 'worker.py', 'state.py', 'cli.py', 'metrics.py', 'fetch.py', 'admission.py')


def module_imports() -> dict[str, set[str]]:
    """Each module's top-level imports of the package (a function-level import is lazy, by design)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob('*.py'):
        parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
        package = list(parts if path.name == '__init__.py' else parts[:-1])
        name = '.'.join(parts[:-1] if path.name == '__init__.py' else parts)
        deps: set[str] = set()
        for node in ast.parse(path.read_text(encoding='utf-8')).body:
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - (node.level - 1)]
                if node.module:
                    deps.add('.'.join(base + [node.module]))
                else:
                    deps.update('.'.join(base + [alias.name]) for alias in node.names)
        graph[name] = deps
    return graph


def test_no_import_cycle():
    graph = module_imports()
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for dep in graph.get(node, ()):
            if dep not in graph:
                continue  # a name imported from a package (rq_policies.__version__)
            assert state.get(dep) != 1, f'import cycle: {" -> ".join(trail + [dep])}'
            if dep not in state:
                visit(dep, trail + [dep])
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [module])


def test_the_glue_names_no_policy_class():
    names = [cls.__name__ for cls in registered()]
    assert {'Loner', 'Throttle', 'Debounce', 'QueueSlot'} <= set(names)
    pattern = re.compile(r'\b(' + '|'.join(names) + r')\b')
    for module in GLUE:
        found = [(i + 1, line) for i, line in enumerate((PACKAGE / module).read_text().splitlines())
                 if pattern.search(line)]
        assert found == [], f'{module} names a policy: {found}'
