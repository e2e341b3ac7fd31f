"""Rollout orchestration: episode requests, agent-loop workers and the manager."""
