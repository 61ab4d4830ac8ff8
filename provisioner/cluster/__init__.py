"""A regional cluster provisioner at its edges: the async shell around the core (runtime), its
leader lease and its gRPC services. The core itself, pure, is provisioner.decide."""
