"""MongoDB storage in @mastra/mongodb's layout, and an in-memory storage for embedded use."""
