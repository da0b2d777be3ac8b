"""Multi-node coordination: where a node stands (topology), the supervisor side (client), the store helper."""
