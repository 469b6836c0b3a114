"""The wheel ships lua/ and works from a fresh virtual environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile

import pytest

from tests.helpers import ROOT


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp('dist')
    # Built from a copy of the tree: pip builds in place (build/, *.egg-info), and CI runs several cells at once.
    source = tmp_path_factory.mktemp('source') / 'rq-policies'
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        '.git', '.ci', 'build', 'dist', 'site', '*.egg-info', '__pycache__', '.venv', '.pytest_cache', '.hypothesis'))
    subprocess.run(
        [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '-q', '-w', str(out), str(source)],
        check=True,
    )
    (found,) = out.glob('rq_policies-*.whl')
    return found


def test_wheel_contains_every_lua_script(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for script in ROOT.joinpath('lua').rglob('*.lua'):
        assert f'rq_policies/lua/{script.relative_to(ROOT / "lua").as_posix()}' in names
    assert 'rq_policies/py.typed' in names


def test_wheel_runs_from_a_fresh_venv(wheel, tmp_path, redis_url):
    env_dir = tmp_path / 'venv'
    venv.create(env_dir, with_pip=True)
    python = env_dir / 'bin' / 'python'
    # the wheel's copy, not a checkout on PYTHONPATH (whose egg-info would also make pip skip the install)
    env = {name: value for name, value in os.environ.items() if name != 'PYTHONPATH'}
    subprocess.run([str(python), '-m', 'pip', 'install', '-q', str(wheel)], check=True, env=env)
    script = textwrap.dedent(
        f"""
        import rq_policies, rq_policies.engine.scripts as s
        from redis import Redis
        from rq_policies import PolicyQueue, Loner
        assert 'site-packages' in str(s._lua_root()), s._lua_root()
        conn = Redis.from_url({redis_url!r})
        conn.flushdb()
        q = PolicyQueue('wheel', connection=conn)
        assert q.enqueue('os.getcwd', policy=Loner()) is not None
        assert q.enqueue('os.getcwd', policy=Loner()) is None
        print('ok')
        """
    )
    result = subprocess.run([str(python), '-c', script], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'ok'
