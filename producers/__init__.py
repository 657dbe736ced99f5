"""Kafka producers: the one shared producer (`output.py`), a publisher per output topic (`enriched.py`,
`persisted.py`, `forgotten.py`, `dead_letters.py`), exactly-once transactions (`transactions.py`), and the
client options and topic metadata every Kafka client of the service uses (`connection.py`)."""
