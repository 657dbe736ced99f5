"""One Kafka runtime under every path: the retry policy (`retry`), containment (`containment`); the
README's "consumers/runtime" section says which job lives where."""
