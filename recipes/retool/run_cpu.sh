#!/usr/bin/env bash
# Prepare the ReTool-mini data (reasoning-gym arithmetic, generated locally), run the
# cold start (a 3-step SFT on 24 tool-call demonstrations) and train with RL on this CPU.
#   recipes/retool/run_cpu.sh [dotted overrides...]
# RETOOL_DIRECT_FRACTION (default 0.5): share of the cold-start demonstrations that answer
# without calling the tool (the policy starts out calling it about half the time, and RL
# raises the rate).
set -euo pipefail
cd "$(dirname "$0")/../.."
export AGENTRL_CACHE="${AGENTRL_CACHE:-$PWD/.cache}"
if [ ! -s .cache/retool/train.jsonl ]; then
    .venv/bin/python recipes/retool/prepare_data.py --out-dir .cache/retool \
        --reasoning-gym basic_arithmetic:500 --rg-val-size 32 \
        --rg-config '{"basic_arithmetic": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}}' \
        --agent-name tool_agent \
        --instruction "You can run Python with the code_interpreter tool. Put the final answer in \\boxed{}."
fi
# Skips itself when .cache/retool/warm-start is current.
.venv/bin/python recipes/retool/warm_start.py --config recipes/retool/cpu.yaml \
    --model builtin:smollm2-135m-instruct --data .cache/retool/train.jsonl \
    --examples 24 --direct-fraction "${RETOOL_DIRECT_FRACTION:-0.5}" --out .cache/retool/warm-start
exec .venv/bin/agentrl train recipes/retool/cpu.yaml "$@"
