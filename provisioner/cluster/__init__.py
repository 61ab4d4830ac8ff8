"""A regional cluster provisioner at its edges: the async shell around the core (runtime.py, which
composes its writer, command runner, read side and watchers' hub), its leader lease and its gRPC
services. The core itself, pure, is provisioner.decide."""
