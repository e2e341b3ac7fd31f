"""agentrl: asynchronous agentic reinforcement learning for LLMs."""

__version__ = "0.1.0"
