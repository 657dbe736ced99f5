"""Wire shapes: Mastra messages and the service events (pydantic v2, no I/O)."""
