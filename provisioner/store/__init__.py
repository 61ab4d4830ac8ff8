"""Durable state: sessions, VMs, what operators set, blocks, the audit log, and the front's
records. SQLite (WAL) on a laptop, PostgreSQL in production, behind one engine and one schema.

Every batch of changes is written in one transaction before the shell acts on it, so a session
is durable before its creation is acknowledged and a VM's record exists before the cloud call
that makes it. Rows keep a few indexed columns plus the full object as JSON. The statements are
written once, in the SQL both databases accept; only the placeholder style differs. A VM's
disk cache and history are rows of their own, so a write carries the layers and state changes
that changed instead of the whole VM each time.

The engine (store/engine.py) composes one repository per aggregate: `store.sessions`,
`store.operator`, `store.blocks`, `store.audit`; the front's records are front/records.py over
the same engine.
"""

from provisioner.store.databases import PostgresStore, SqliteStore, open_store, redact
from provisioner.store.engine import Store, StoreError
from provisioner.store.schema import MIGRATIONS

__all__ = ["MIGRATIONS", "PostgresStore", "SqliteStore", "Store", "StoreError", "open_store", "redact"]
