"""A multi-turn verifiers environment for the adapter's tests: the env's ``run`` answers
each guess with a hint until the model names the number (or ``max_guesses`` run out).
``fail_after`` makes ``run`` raise after that many guesses."""

import re

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    @vf.reward
    async def found(self, task, trace) -> float:
        return float(trace.last_reply.strip() == str(task.secret))


class GuessTaskset(vf.Taskset[GuessTask]):
    def load(self):
        for secret in (7, 3):
            yield GuessTask(
                GuessData(prompt="Guess my number (1-9); say only the number.", secret=secret)
            )


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()
    max_guesses: int = 4
    fail_after: int | None = None


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as player:
            reply = await player.turn()
            for guess in range(1, self.config.max_guesses):
                if self.config.fail_after == guess:
                    raise RuntimeError("the hint machine broke")
                number = re.search(r"\d+", reply.last_reply)
                if number is None:
                    hint = "Say a number."
                elif int(number.group()) == task.data.secret:
                    return
                else:
                    hint = "Higher." if int(number.group()) < task.data.secret else "Lower."
                reply = await player.turn(hint)


__all__ = ["GuessEnv", "GuessTaskset"]
