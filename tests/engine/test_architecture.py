"""The structure the policy engine promises, checked: no import cycle, and glue that names no policy."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from rq_policies.engine.policy import registered
from tests.helpers import PACKAGE, cases

GLUE = ('engine/queue.py', 'engine/worker.py', 'engine/worker_mixin.py', 'engine/wake.py', 'engine/guard.py',
        'surfaces/state.py', 'surfaces/cli.py', 'surfaces/metrics.py', 'engine/fetch.py', 'engine/admission.py')


def module_imports() -> dict[str, set[str]]:
    """Each module's imports of the package, top level and inside functions alike (issue 32: a function-level import
    is how a circle hides), each resolved to the module it names."""
    modules = {}
    for path in PACKAGE.rglob('*.py'):
        parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
        modules['.'.join(parts[:-1] if path.name == '__init__.py' else parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for _, target in _imports_everywhere(path):
            while target not in modules and '.' in target:  # a name imported from a module: that module
                target = target.rsplit('.', 1)[0]
            if target != name:
                deps.add(target)
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import circle of ``graph`` (its modules in order, the first again at the end), or [] when there is none."""
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str]:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                return trail[trail.index(dep):] + [dep]
            if dep not in state and (found := visit(dep, trail + [dep])):
                return found
        state[node] = 2
        return []

    for module in sorted(graph):
        if module not in state and (found := visit(module, [module])):
            return found
    return []


def test_no_import_cycle():
    """No circle, counting imports inside functions (the face, ``rq_policies/__init__.py``, imports every public
    name: a module reaching back to it, even for ``__version__``, would close one)."""
    graph = module_imports()
    assert 'rq_policies.engine.keys' in graph['rq_policies.engine.ops']  # ops imports keys inside a function
    found = _cycle(graph)
    assert found == [], f'import cycle: {" -> ".join(found)}'


def test_the_cycle_check_sees_an_import_inside_a_function():
    """The check above finds a circle closed by an import made inside a function."""
    assert _cycle({'a': {'b'}, 'b': set()}) == []
    assert _cycle({'a': {'b'}, 'b': {'a'}}) == ['a', 'b', 'a']
    graph = module_imports()
    graph['rq_policies.engine.keys'].add('rq_policies.engine.ops')  # as if keys imported ops inside a function
    assert _cycle(graph) != []


def _imports_everywhere(path: Path) -> list[tuple[int, str]]:
    """Every import of the package in ``path`` (top level and inside functions alike), as (line, module) with a
    relative import made absolute."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix('').parts)
    package = parts if path.name == '__init__.py' else parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith('rq_policies')]
        elif isinstance(node, ast.ImportFrom):
            base = '.'.join(package[: len(package) - node.level + 1] + [node.module or '']) if node.level \
                else node.module or ''
            found += [(node.lineno, f'{base.rstrip(".")}.{alias.name}' if base.startswith('rq_policies') else base)
                      for alias in node.names]
    return [(line, name) for line, name in found if name.startswith('rq_policies')]


#: The wings, lowest first: a module imports only from its own wing or one below (issue 32). The face
#: (``rq_policies/__init__.py``) and the aliases of moved modules beside it stand above them all.
WINGS = ('engine', 'policies', 'surfaces')


def test_the_wings_import_downwards_only():
    """surfaces -> policies -> engine, never back (issue 32), imports inside functions counted: the engine imports no
    policy and no surface, a policy no surface and no other policy. A base several policies share is in the engine
    (KeyedPolicy, KeyedViews), and what their views read too (engine/reading.py)."""
    def floor(parts: tuple[str, ...] | list[str]) -> int:
        return WINGS.index(parts[0]) if parts and parts[0] in WINGS else len(WINGS)

    found = []
    for path in sorted(PACKAGE.rglob('*.py')):
        here = path.relative_to(PACKAGE).parts
        if here[0] not in WINGS:
            continue
        for line, name in _imports_everywhere(path):
            there = name.split('.')[1:]
            other_policy = here[0] == 'policies' and there[:1] == ['policies'] and len(here) > 2 and len(there) > 1 \
                and there[1] != here[1]
            if floor(there) > floor(here) or other_policy:
                found.append(f'{path.relative_to(PACKAGE)}:{line} imports {name}')
    assert found == [], found


def test_the_glue_names_no_policy_class():
    names = [cls.__name__ for cls in registered()]
    assert {'Loner', 'Throttle', 'Debounce', 'QueueSlot'} <= set(names)
    pattern = re.compile(r'\b(' + '|'.join(names) + r')\b')
    for module in GLUE:
        found = [(i + 1, line) for i, line in enumerate((PACKAGE / module).read_text().splitlines())
                 if pattern.search(line)]
        assert found == [], f'{module} names a policy: {found}'


def _private_names(paths) -> set[str]:
    """The single-underscore names the modules at ``paths`` define: methods, attributes set, module globals."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return {name for name in names if name.startswith('_') and not name.startswith('__')}


def test_rq_s_private_names_are_used_only_in_compat():
    """``job._status``, ``queue._persist_job`` and friends go through rq_policies/compat.py (one function each), so
    a change of rq's internals is fixed there. Overriding a private method (``def _enqueue_job``) and calling the
    parent's (``super()._enqueue_job(...)``) is a subclass's contract and stays in its class; ``self._x`` where
    rq-policies defines ``_x`` itself is its own."""
    import rq

    rq_private = _private_names(Path(rq.__file__).parent.rglob('*.py'))
    modules = [path for path in PACKAGE.rglob('*.py') if path.name != 'compat.py' and path.name != '_moved.py']
    ours = _private_names(modules)
    found = []
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'))):
            if isinstance(node, ast.Attribute) and node.attr in rq_private:
                value = node.value
                if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == 'super':
                    continue
                on_self = isinstance(value, ast.Name) and value.id in ('self', 'cls')
                if on_self and node.attr in ours:  # an attribute or method of rq-policies' own class
                    continue
                found.append(f'{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}')
            elif isinstance(node, ast.ImportFrom) and (node.module or '').split('.')[0] == 'rq':
                found += [f'{path.relative_to(PACKAGE)}:{node.lineno} import {alias.name}' for alias in node.names
                          if alias.name.startswith('_')]
    assert found == [], found


def test_the_engine_s_protocols_are_narrow_typed_and_met():
    """The engine's interface to a policy (rq_policies/protocols.py): a dozen methods or fewer in all, no ``Any`` in a
    signature, and met by every registered policy (an admission policy's examples, a per-job fetch policy's as
    declared on a call, every fetch policy class)."""
    import inspect

    from rq_policies.engine.policy import ADMISSION, FETCH
    from rq_policies.engine.protocols import AdmissionSide, Declared, FetchSide

    methods = {}
    for proto in (Declared, AdmissionSide, FetchSide):
        for name, member in vars(proto).items():
            if inspect.isfunction(member) and not name.startswith('_'):
                methods[f'{proto.__name__}.{name}'] = member
    assert 0 < len(methods) <= 12, sorted(methods)
    for name, member in methods.items():
        annotations = ' '.join(str(value) for value in member.__annotations__.values())
        assert 'Any' not in annotations, (name, annotations)
        assert member.__doc__, f'{name} is not documented'
    for cls in registered(ADMISSION):
        for example in cases.examples(cls):
            assert isinstance(example, AdmissionSide), example
    for cls in registered(FETCH):
        assert isinstance(cls, FetchSide), cls
        if cls.per_job:
            for example in cases.examples(cls):
                assert isinstance(example, Declared), example



#: What a view is rendered with: a policy module names none of these (issue 21, rules and views apart).
VIEW_LIBRARIES = ('click', 'flask', 'werkzeug', 'jinja2', 'prometheus_client')


def _imported_roots(source: str) -> list[tuple[int, str]]:
    """Every absolute import in ``source`` (top level, function-local and under ``TYPE_CHECKING`` alike, and
    ``importlib.import_module('x')``/``__import__('x')`` with a literal name), as (line, top-level package name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.partition('.')[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.append((node.lineno, node.module.partition('.')[0]))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) \
                and getattr(node.func, 'id', getattr(node.func, 'attr', None)) in ('import_module', '__import__'):
            found.append((node.lineno, node.args[0].value.partition('.')[0]))
    return found


def test_the_import_reader_sees_lazy_imports():
    """The reader the next test relies on finds an import inside a function, as the policies' view hooks made them
    before issue 21 (``import click`` in ``cli_commands``, ``from prometheus_client.core import ...`` in
    ``metric_families``)."""
    source = ('import json\n'
              'def commands(cls):\n'
              '    import click\n'
              '    from prometheus_client.core import GaugeMetricFamily\n'
              '    from . import state\n'
              '    return importlib.import_module("flask.app")\n')
    assert [root for _, root in _imported_roots(source)] == ['json', 'click', 'prometheus_client', 'flask']


def test_no_policy_module_imports_a_view_library():
    """A policy module holds its rules; what the CLI and the metrics show of it its views module describes
    (:mod:`rq_policies.engine.views`), and the renderers (cli.py, metrics.py, dashboard/) alone import click,
    prometheus_client and Flask. Every module that defines a registered policy or its views is read, imports inside
    functions included."""
    import sys

    from rq_policies.engine.views import shown

    modules = {cls.__module__ for cls in registered()} | {found.__module__ for found in shown()}
    assert {'rq_policies.policies.loner.rules', 'rq_policies.policies.queue_slot.rules',
            'rq_policies.policies.concurrency.rules', 'rq_policies.policies.fair.rules',
            'rq_policies.policies.loner.views', 'rq_policies.policies.fair.views'} <= modules
    found = []
    # what policies use to say it
    described = {'rq_policies.engine.views', 'rq_policies.engine.policy', 'rq_policies.engine.protocols',
                 'rq_policies.engine.reading', 'rq_policies.engine.keyed'}
    for module in sorted(modules | {name for name in described if name in sys.modules}):
        path = Path(sys.modules[module].__file__)
        found += [f'{path.name}:{line} imports {root}' for line, root in _imported_roots(path.read_text('utf-8'))
                  if root in VIEW_LIBRARIES]
    assert found == [], found
