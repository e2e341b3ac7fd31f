"""The verifiers environment of ``bench/env_loop_overhead.py`` (``verifiers:vf_null``): a
verifiers 0.4 taskset of one task whose ``Env.run`` answers each of the model's turns at
once with the same message, for ``turns`` turns, and a reward that scores the trace.

Imported by verifiers' own loader as a taskset module, so the bench puts this folder on
``sys.path``.
"""

import verifiers.v1 as vf


class NullTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def replied(self, task, trace) -> float:
        return float(bool(trace.last_reply))


class NullTaskset(vf.Taskset[NullTask]):
    def load(self):
        yield NullTask(vf.TaskData(prompt="Start. Answer with one action: right, left."))


class NullEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()
    turns: int = 8


class NullEnv(vf.Env[NullEnvConfig]):
    """``turns`` model turns, each but the first opened by ``You moved.``"""

    async def run(self, task, agents):
        async with agents.player.interaction(task) as player:
            await player.turn()
            for _ in range(self.config.turns - 1):
                await player.turn("You moved.")


__all__ = ["NullEnv", "NullTaskset"]
