"""The dependency-free core every agentrl process shares.

Only the standard library and pydantic: what the layers exchange (``types``: sampling
parameters, an engine's token output, pause modes; ``trajectory``: ``AgentLoopOutput``
and ``TrajectoryBuilder``; ``weights``: the wire format of a weight push), the config
base and the sections several layers read (``config``: ``model``, ``ray``). Every other
package imports downward from here, never the reverse;
``tests/unit/test_import_contracts.py`` checks it.
"""
