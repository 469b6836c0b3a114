"""One version, written once (issue 33): ``rq_policies/engine/__init__.py`` holds it, setup.py reads it from there,
``rq-policies --version`` prints it and CHANGELOG.md's newest heading names it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

import rq_policies
from rq_policies.surfaces.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_changelog_s_newest_heading_the_package_setup_and_the_command_say_one_version():
    newest = re.search(r'^## (\S+)', (ROOT / 'CHANGELOG.md').read_text(encoding='utf-8'), re.MULTILINE).group(1)
    assert rq_policies.__version__ == newest
    assert "version='" not in (ROOT / 'setup.py').read_text(encoding='utf-8')  # no second copy
    built = subprocess.run([sys.executable, 'setup.py', '--version'], cwd=ROOT, capture_output=True, text=True,
                           timeout=120)
    assert built.stdout.strip().splitlines()[-1] == newest, built.stderr
    shown = CliRunner().invoke(main, ['--version'])
    assert shown.exit_code == 0 and shown.output.strip() == f'rq-policies, version {newest}'
