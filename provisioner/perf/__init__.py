"""Benchmarks of the serving path: `python -m provisioner.perf.serving` (the front and a cluster
against a raw grpc.aio echo, as separate processes), `python -m provisioner.perf.commits` (the
store's durable writes with and without group commit) and `python -m provisioner.perf.gcpause`
(a full garbage collection with a cluster's restored state, before and after gc.freeze)."""
