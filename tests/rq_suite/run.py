#!/usr/bin/env python
"""Run rq's own test suite with PolicyQueue, PolicyWorker, PolicySimpleWorker and PolicyJob in place of rq's classes.

The drop-in check: rq-policies' classes should pass the tests rq's own classes pass. Usage::

    python tests/rq_suite/run.py                  # the installed rq's suite, classes substituted
    python tests/rq_suite/run.py --stock          # the same suite with rq's own classes (the baseline)
    python tests/rq_suite/run.py -- -k test_queue # anything after -- goes to pytest

It downloads the sdist of the installed rq version with pip (cached in ``$RQ_SUITE_CACHE``, by default
``~/.cache/rq-policies/rq-suite``), copies its ``tests/`` to a temporary directory, starts a throwaway server
(:class:`rq_policies.surfaces.testing.RedisServer`) on a free port, points rq's tests at it (they hard-code
``localhost:6379``), and runs pytest with the plugin ``rq_suite_substitute.py`` next to this file. The stock run
passes in full (bar a timing-sensitive worker-pool test on a loaded machine). It needs
``psutil`` (one of rq's test dependencies). It prints the failing tests and the counts; the exit status is pytest's.

Not collected by the project's own pytest run (no ``test_*.py`` here). ``docs/rq-suite.md`` lists the failures
expected with the classes substituted, and why each is an artifact of the substitution.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent


def sdist_tests(rq_version: str, cache: Path) -> Path:
    """The unpacked sdist of rq ``rq_version`` (downloaded with pip on first use)."""
    root = cache / f'rq-{rq_version}'
    if (root / 'tests').is_dir():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    archive = next(cache.glob(f'rq-{rq_version}.tar.gz'), None)
    if archive is None:
        subprocess.run(
            [sys.executable, '-m', 'pip', 'download', '--quiet', '--no-binary', ':all:', '--no-deps',
             f'rq=={rq_version}', '-d', str(cache)],
            check=True,
        )
        archive = cache / f'rq-{rq_version}.tar.gz'
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.isfile() or m.isdir()]
        if sys.version_info >= (3, 12):
            tar.extractall(cache, members=members, filter='data')
        else:
            tar.extractall(cache, members=members)  # noqa: S202 (a PyPI sdist of rq, regular files only)
    return root


def prepare(root: Path, workdir: Path, port: int) -> None:
    """Copy rq's tests (without the ``rq`` package next to them) and point their hard-coded URLs at our port.

    Only ``host:6379`` is rewritten: a bare ``6379`` is an assertion on rq's default port (``test_cli``), and bare
    ``Redis()`` calls are redirected by the plugin.
    """
    shutil.copytree(root / 'tests', workdir / 'tests')
    shutil.copy(root / 'pyproject.toml', workdir / 'pyproject.toml')  # pytest's options and markers
    for path in (workdir / 'tests').rglob('*.py'):
        text = path.read_text()
        rewritten = re.sub(r':6379(?![\d])', f':{port}', text)
        if rewritten != text:
            path.write_text(rewritten)
    site = workdir / 'site'
    site.mkdir()
    (site / 'sitecustomize.py').write_text(
        'import rq_suite_port\n\nrq_suite_port.redirect_default_port()\n'
    )


def summary(junit: Path) -> tuple[dict[str, int], list[str]]:
    counts = {'passed': 0, 'failed': 0, 'error': 0, 'skipped': 0}
    failing: list[str] = []
    for case in ET.parse(junit).getroot().iter('testcase'):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if 'failure' in kinds:
            counts['failed'] += 1
            failing.append(f'FAILED {name}')
        elif 'error' in kinds:
            counts['error'] += 1
            failing.append(f'ERROR  {name}')
        elif 'skipped' in kinds:
            counts['skipped'] += 1
        else:
            counts['passed'] += 1
    return counts, failing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--stock', action='store_true', help="run with rq's own classes (the baseline)")
    parser.add_argument('--cache', type=Path,
                        default=Path(os.environ.get('RQ_SUITE_CACHE', Path.home() / '.cache/rq-policies/rq-suite')))
    parser.add_argument('--keep', action='store_true', help='keep the temporary copy of the tests')
    parser.add_argument('pytest_args', nargs='*', help='passed to pytest (after --)')
    args = parser.parse_args(argv)

    try:
        import psutil  # noqa: F401
    except ImportError:
        parser.error("rq's tests need psutil: pip install psutil")
    from rq_policies.surfaces.testing import RedisServer

    rq_version = version('rq')
    root = sdist_tests(rq_version, args.cache)
    workdir = Path(tempfile.mkdtemp(prefix=f'rq-suite-{rq_version}-'))
    server = RedisServer().start()
    try:
        prepare(root, workdir, server.port)
        junit = workdir / 'junit.xml'
        # rq's own `tests` package (in workdir) first: a PYTHONPATH naming this repository's root would otherwise
        # give rq's subprocess workers our `tests` package, and their jobs (`tests.test_worker...`) would not import
        path = [str(workdir), str(workdir / 'site'), str(HERE), os.environ.get('PYTHONPATH', '')]
        env = dict(os.environ, RQ_SUITE_PORT=str(server.port), PYTHONPATH=os.pathsep.join(filter(None, path)),
                   PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get('PATH', '')]))  # rqworker
        env.pop('RQ_SUITE_STOCK', None)
        if args.stock:
            env['RQ_SUITE_STOCK'] = '1'
        command = [sys.executable, '-m', 'pytest', 'tests', '-p', 'rq_suite_substitute', '-p', 'no:cacheprovider',
                   '-q', '--tb=short', '-rfE', f'--junitxml={junit}', *args.pytest_args]
        returncode = subprocess.run(command, cwd=workdir, env=env).returncode
        if junit.exists():
            counts, failing = summary(junit)
            mode = 'stock rq classes' if args.stock else 'rq-policies classes substituted'
            print(f'\n== rq {rq_version} test suite, {mode} ==')
            for line in failing:
                print(line)
            print(', '.join(f'{n} {k}' for k, n in counts.items()))
        return returncode
    finally:
        server.close()
        if args.keep:
            print(f'tests kept in {workdir}')
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
