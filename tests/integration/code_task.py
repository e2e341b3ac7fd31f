"""A toy task whose episodes make one real ``code_interpreter`` call each
(``agentrl.testing.loops:CodeToolLoop``): the fault runs' multi-turn tool loop."""

from __future__ import annotations

import json
from pathlib import Path

from toy_task import toy_row

SANDBOX_TOOLS = """
tools:
  - class_name: agentrl.tools.code_interpreter.CodeInterpreterTool
    config: {wall_time_s: 3, cpu_time_s: 3, max_concurrency: 4}
"""
QUICK_CODE = "print(sum(range({i})))"
HANGING_CODE = "import time\ntime.sleep(3600)"
SLOW_CODE = "import time\ntime.sleep(1)"


def _write_code_rows(path: Path, count: int, hang_every: int | None) -> None:
    """Toy rows whose episode runs ``extra_info["code"]`` in the sandbox. With
    ``hang_every``, that row of every group of it never ends (the wall-clock limit kills
    it) and the others take a second; without, each prints a number at once."""
    with path.open("w") as f:
        for i in range(count):
            if hang_every is None:
                code = QUICK_CODE.format(i=i)
            else:
                code = HANGING_CODE if i % hang_every == hang_every - 1 else SLOW_CODE
                code = f"{code}\nprint({i})"
            f.write(json.dumps(toy_row(f"Run the code of row {i}.", code=code)) + "\n")


def code_tool_overrides(tmp: Path, hang_every: int | None = None) -> list[str]:
    """Overrides (after ``toy_config``'s) that run ``CodeToolLoop`` on 32 code rows written
    under ``tmp``, with the code interpreter as the one tool."""
    rows, tools = tmp / "code.jsonl", tmp / "tools.yaml"
    _write_code_rows(rows, 32, hang_every)
    tools.write_text(SANDBOX_TOOLS)
    return [
        "rollout.agent_name=agentrl.testing.loops:CodeToolLoop",
        f"rollout.tool_config_path={tools}",
        "rollout.tool_timeout_s=30",
        "rollout.tools_prompt_template='Tools: {tools}'",
        "rollout.max_response_length=48",  # room for the tool's answer and a last turn
        f"data.train_files=[{rows}]",
        "data.max_prompt_length=512",  # the tool's schema is in the prompt
        "server.engine.max_model_len=1024",
    ]
