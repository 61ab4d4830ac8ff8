"""Benchmarks of the serving path: `python -m provisioner.perf.serving` (the front and a cluster
against a raw grpc.aio echo, as separate processes) and `python -m provisioner.perf.commits`
(the store's durable writes with and without group commit)."""
