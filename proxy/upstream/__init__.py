"""Provider clients (openai-compatible, anthropic, offline) and the router."""
