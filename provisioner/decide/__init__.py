"""The cluster's brain: one cluster's state machine (ClusterCore.handle(*events) -> Step) and the
pure decisions it takes (assignment, autoscaling, forecasting, prewarming, image layers, state
tables, reconciliation, policy bounds, deadlines). No I/O, no wall clock, no event loop: the live
runtime, the simulator and the tests drive the same code (see tests/test_imports.py)."""
