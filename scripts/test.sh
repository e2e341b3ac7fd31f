#!/usr/bin/env bash
# Set up a fresh machine (scripts/setup.sh) and run the linter and the whole test suite.
#   scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh cpu
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python -m pytest -q -ra "$@"
