"""Durable state: sessions, VMs, the front's idempotency keys and attempts. SQLite (WAL) on a
laptop, PostgreSQL in production, behind one class and one schema.

Every batch of changes is written in one transaction before the shell acts on it, so a session
is durable before its creation is acknowledged and a VM's record exists before the cloud call
that makes it. Rows keep a few indexed columns plus the full object as JSON. The statements are
written once, in the SQL both databases accept; only the placeholder style differs. A VM's
disk cache and history are rows of their own, so a write carries the layers and state changes
that changed instead of the whole VM each time.
"""

from provisioner.store.base import StoreError
from provisioner.store.engine import PostgresStore, SqliteStore, Store, open_store, redact
from provisioner.store.front_records import MADE, UNRESOLVED
from provisioner.store.schema import MIGRATIONS

__all__ = ["MADE", "MIGRATIONS", "UNRESOLVED", "PostgresStore", "SqliteStore", "Store", "StoreError", "open_store",
           "redact"]
