"""The trace-driven simulator: the real cluster cores on a virtual clock."""
