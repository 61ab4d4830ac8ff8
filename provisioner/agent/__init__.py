"""The agent on every GPU VM (`provisioner agent`): the cluster's hands on the machine.

It takes commands from the instance's metadata (`provisioner-command`: pull image layers, wipe
after a user) and reports back as guest attributes under `provisioner/`: `ready`, per command
`progress-<id>` ("<bytes> <seconds left>") and `done-<id>`, `healthy` and `health-detail`, `usage`
(what the session runs: GPU utilization, process names, outbound connections; `usage.py`), and
`maintenance` or `preempted` when Compute announces host maintenance or takes a Spot VM back.
Writes stay within Compute's rate of about 10 a minute (`guest.py`).

Every outside thing sits behind a small interface with a fake (`fakes.py`): the metadata server
(`metadata.py`), the container runtime (`containers.py`), NVML (`gpu.py`, through the
`nvidia-ml-py` module or a fake with the same functions) and the host's processes and files
(`host.py`; connections from /proc in `procnet.py`). Time is injected. Health decisions are pure
(`health.assess`).
"""
