"""Kafka consumers: one module per input topic path."""
