"""The front: the public API, routing across clusters, idempotent creation."""
