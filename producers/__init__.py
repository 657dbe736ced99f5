"""Kafka producers: one module per output topic."""
