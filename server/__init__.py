"""Rollout serving: engines, the Ray Serve deployment, routing and the client."""
