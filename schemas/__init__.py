"""Wire shapes: Mastra messages and the service events (pydantic v2), their decoding and encoding, limits and
ids. No I/O, except `export.py`, which writes the generated JSON Schema / AsyncAPI files (`message-history
schemas`)."""
