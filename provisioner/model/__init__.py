"""The values the fleet speaks in: sessions and VMs, their states, image catalogs, abuse
decisions and the error taxonomy. Plain data and guarded state changes; no I/O."""
