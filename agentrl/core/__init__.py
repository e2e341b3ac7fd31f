"""The dependency-free core every agentrl process shares.

Only the standard library and pydantic: the config base and the sections several layers
read (``model``, ``ray``). Every other package imports downward from here, never the
reverse; ``tests/unit/test_import_contracts.py`` checks it.
"""
