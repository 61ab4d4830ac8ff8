"""Cloud backends behind one small interface (base.CloudBackend): sim, gce, gke.

Only backend modules import cloud SDKs, and lazily, so the package works without them.
"""
