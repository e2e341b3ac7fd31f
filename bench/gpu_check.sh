#!/usr/bin/env bash
# Run bench/gpu_check.py on a GPU machine that has Python, torch and transformers but
# neither agentrl nor its pure-python dependencies, and no network (the device image of
# README.md "GPU check"). Wheels carried in .whl/ (pydantic, pydantic-core, annotated-types,
# typing-inspection, typing-extensions for Python 3.12) go to $SITE; agentrl itself is
# copied there in its installed layout (pyproject's package-dir: server/, tools/ and
# agent_loops/ are agentrl.server, agentrl.tools, agentrl.agent_loops). Arguments go to
# the script:
#
#   bash bench/gpu_check.sh --sizes tiny,small --out "$OUT/gpu_check.json"
set -euo pipefail
cd "$(dirname "$0")/.."
SITE=${SITE:-/tmp/site}
PYTHON=${PYTHON:-python3}
mkdir -p "$SITE"
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl
fi
# AGENTRL_SRC: where the package folders are taken from (default: this checkout), e.g. a
# `git archive HEAD agentrl server tools agent_loops` extract, to run exactly a commit.
SRC=${AGENTRL_SRC:-.}
rm -rf "$SITE/agentrl"
cp -r "$SRC/agentrl" "$SITE/agentrl"
for sub in server tools agent_loops; do
    cp -r "$SRC/$sub" "$SITE/agentrl/$sub"
done
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" -c 'import sys, torch, transformers, pydantic
print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      "transformers", transformers.__version__, "pydantic", pydantic.__version__)'
exec "$PYTHON" bench/gpu_check.py "$@"
