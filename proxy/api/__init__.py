"""The HTTP edge: OpenAI-compatible routes, module routes, health, errors."""
