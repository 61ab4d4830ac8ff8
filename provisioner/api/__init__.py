"""The gRPC edge: conversions between domain objects and protos, status mapping, servers."""
