#!/usr/bin/env bash
# Set up a virtualenv with mcdc and its dev tools (PyPI only), then run the linters and the test suite.
# The integration tests start their own MongoDB-compatible servers (SecantusDB); to run them against a
# real mongod replica set instead, export MCDC_TEST_SOURCE_URI and MCDC_TEST_TARGET_URI (their user
# databases are dropped!).
#
# --quick: the linters, the docs' build and the tests that start no server, broker or Spark (under 3 minutes);
# CI runs everything.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=""
if [ "${1:-}" = "--quick" ]; then
  QUICK=1
  shift
fi
VENV="${MCDC_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -e '.[dev]'
# Compiled once here, even where PYTHONDONTWRITEBYTECODE is set (as on some CI runners): the suite starts
# many mcdc processes and Spark Python workers, and each would otherwise compile mcdc's modules again.
"$VENV/bin/python" -m compileall -q replicator >/dev/null
"$VENV/bin/python" -m ruff check .
"$VENV/bin/python" -m ruff format --check .
"$VENV/bin/python" -m mypy
# The docs (docs/, mkdocs.yml): a broken link or anchor, or a page left out of the navigation, fails the build.
# Built into a temporary directory, never into the repository.
SITE="$(mktemp -d)"
trap 'rm -rf "$SITE"' EXIT
NO_MKDOCS_2_WARNING=1 "$VENV/bin/python" -m mkdocs build --strict --site-dir "$SITE"
if [ -n "$QUICK" ]; then
  MCDC_TEST_QUICK=1 exec "$VENV/bin/python" -m pytest -n "${MCDC_TEST_WORKERS:-2}" -m "not integration" "$@"
fi
# Each worker starts servers of its own; external servers are shared, so their tests run one at a time.
# With --dist loadgroup, the tests that use the session's SparkSession share one worker (one session for the
# suite) and the longest tests start first (tests/support/schedule.py).
WORKERS=(-n "${MCDC_TEST_WORKERS:-3}" --dist loadgroup)
if [ -n "${MCDC_TEST_SOURCE_URI:-}${MCDC_TEST_KAFKA_BOOTSTRAP:-}" ]; then
  WORKERS=(-p no:xdist)
fi
"$VENV/bin/python" -m pytest "${WORKERS[@]}" "$@"
