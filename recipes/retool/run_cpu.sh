#!/usr/bin/env bash
# Prepare the ReTool-mini data (arithmetic on 3–5-digit numbers, generated from a seed:
# 2000 training and 128 held-out problems, and the held-out set without tools as a
# control), run the cold start (a 3-step SFT on 24 demonstrations) and train with RL on
# this CPU.
#   recipes/retool/run_cpu.sh [dotted overrides...]
# RETOOL_DIRECT_FRACTION (default 0.65): the share of cold-start demonstrations that
# answer at once, without the tool (with a number the model cannot have worked out). The
# cold start teaches the call format and leaves the choice to call to RL: at 0.65 the
# policy, decoding greedily, answers all 128 held-out problems directly (none right), while
# at 0.5 it calls the tool on all of them (75% right): RL has to learn to call it.
set -euo pipefail
cd "$(dirname "$0")/../.."
export AGENTRL_CACHE="${AGENTRL_CACHE:-$PWD/.cache}"
# Deterministic and takes a second: always written, so an older task's files never linger.
.venv/bin/python recipes/retool/prepare_data.py --out-dir .cache/retool \
    --arithmetic 2000 --arithmetic-val 128 --agent-name tool_agent \
    --instruction "You can run Python with the code_interpreter tool. Put the final answer in \\boxed{}." \
    --control-instruction "Put the final answer in \\boxed{}."
# Skips itself when .cache/retool/warm-start is current.
.venv/bin/python recipes/retool/warm_start.py --config recipes/retool/cpu.yaml \
    --model builtin:smollm2-135m-instruct --data .cache/retool/train.jsonl --examples 24 \
    --direct-fraction "${RETOOL_DIRECT_FRACTION:-0.65}" --out .cache/retool/warm-start
exec .venv/bin/agentrl train recipes/retool/cpu.yaml "$@"
