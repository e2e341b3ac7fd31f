#!/usr/bin/env bash
# Set up a fresh machine (scripts/setup.sh) and run the linter and the whole test suite.
#   scripts/test.sh                    the unit tests on every core, then the integration
#                                      and end-to-end tests one at a time
#   scripts/test.sh [pytest args]      one pytest run with these arguments
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh cpu
.venv/bin/ruff check .
.venv/bin/ruff format --check .
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest -q -ra "$@"
fi
# Unit tests start no Ray, Serve or engine and bind no fixed port, so they run in
# parallel; the integration modules each own Ray and fixed ports, so they run in turn.
.venv/bin/python -m pytest -q -ra -n auto tests/unit
.venv/bin/python -m pytest -q -ra tests/integration tests/e2e
