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
# Unit tests start no Ray, Serve or engine and bind no fixed port, so they run on every
# core. Each integration module owns its Ray instance; two modules run at once (whole
# modules per worker, `--dist loadfile`): each module's fixed HTTP port is its own, and the
# toy task's, which several share, moves per worker (agentrl.testing.serving.worker_port).
# A module spends much of its time importing vLLM on one core; the second worker uses the
# other. More workers than that would starve a 2-core machine's engines.
.venv/bin/python -m pytest -q -ra -n auto tests/unit
.venv/bin/python -m pytest -q -ra -n 2 --dist loadfile tests/integration tests/e2e
