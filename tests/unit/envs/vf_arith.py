"""A verifiers taskset for the adapter's tests: sums to answer in ``\\boxed{}``, with an
adder tool. ``url`` makes ``load`` fetch its data (a taskset that needs the network)."""

import httpx
import verifiers.v1 as vf


class ArithData(vf.TaskData):
    answer: int


class ArithConfig(vf.TasksetConfig):
    size: int = 3
    url: str | None = None


class ArithTask(vf.Task[ArithData]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return float(vf.extract_boxed_answer(trace.last_reply) == str(task.answer))

    @vf.reward(weight=0.5)
    async def used_tool(self, trace) -> float:
        return float(bool(trace.tool_messages))

    @vf.metric
    async def turns(self, trace) -> float:
        return float(trace.num_turns)


class Adder(vf.Toolset):
    @vf.tool
    def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self):
        if self.config.url:
            httpx.get(self.config.url, timeout=2.0).raise_for_status()
        for a in range(self.config.size):
            yield ArithTask(
                ArithData(
                    system_prompt="Answer in \\boxed{}.",
                    prompt=f"What is {a} + 2?",
                    answer=a + 2,
                ),
                self.config.task,
            )

    @classmethod
    def toolsets(cls, config):
        return [Adder(vf.ToolsetConfig())]


__all__ = ["ArithTaskset"]
