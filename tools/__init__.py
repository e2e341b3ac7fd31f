"""Tools agents can call (OpenAI function-calling schema)."""
