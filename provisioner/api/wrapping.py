"""Method handlers wrapped once, as a service is registered, instead of by server interceptors.

A grpc.aio server with any interceptor awaits a chain of coroutines on every call just to find
the call's handler. What our layers add (tracing, the guard) depends on the method alone, so each
method's handler is wrapped once, when the service is added, and the server runs without
interceptors.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping

import grpc

# (full method name "/package.Service/Method", its handler) -> the handler to serve it with, or
# None to leave the method unserved (UNIMPLEMENTED).
Wrapper = Callable[[str, grpc.RpcMethodHandler], "grpc.RpcMethodHandler | None"]


def wrap(method: str, handler: grpc.RpcMethodHandler | None,
         wrappers: Iterable[Wrapper]) -> grpc.RpcMethodHandler | None:
    """`handler` inside each of `wrappers` (outermost first)."""
    for wrapper in reversed(list(wrappers)):
        if handler is None:
            break
        handler = wrapper(method, handler)
    return handler


class WrappingServer:
    """The grpc.aio server as a service's `add_..._to_server` sees it: the handlers it adds are
    wrapped by `wrappers` (outermost first); everything else is the server's own."""

    def __init__(self, server: grpc.aio.Server, wrappers: Iterable[Wrapper]):
        self._server, self._wrappers = server, tuple(wrappers)

    def __getattr__(self, name: str):
        return getattr(self._server, name)

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers([_WrappedGeneric(h, self._wrappers) for h in handlers])

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]) -> None:
        wrapped = {name: wrap(f"/{service}/{name}", h, self._wrappers) for name, h in handlers.items()}
        self._server.add_registered_method_handlers(service, {n: h for n, h in wrapped.items() if h is not None})


class _WrappedGeneric(grpc.GenericRpcHandler):
    """A generic handler whose answers are wrapped, once per method (a handler made anew per
    call is wrapped anew)."""

    def __init__(self, inner: grpc.GenericRpcHandler, wrappers: tuple[Wrapper, ...]):
        self._inner, self._wrappers = inner, wrappers
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler | None]] = {}

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(details)
        if handler is None:
            return None
        inner, wrapped = self._wrapped.get(details.method, (None, None))
        if inner is not handler:
            wrapped = wrap(details.method, handler, self._wrappers)
            self._wrapped[details.method] = handler, wrapped
        return wrapped
