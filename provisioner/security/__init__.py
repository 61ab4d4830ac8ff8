"""Who may call what: TLS material, bearer tokens, callers and the authorization table.

Credentials are turned into a typed `Caller` once, at the server's edge (`api/guard.py`); the
decision (`auth.authorize`) is a pure function of the caller, the RPC and the request.
"""
