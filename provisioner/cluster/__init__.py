"""A regional cluster provisioner: the pure core, its async shell and its gRPC services."""
