"""What an operator sees of a running process: logs, traces, metrics and event-loop lag."""
