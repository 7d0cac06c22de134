"""ML Metadata's gRPC service (``ml_metadata.MetadataStoreService``) over the ml-metadata
wheel's store, for the KFP tests: KFP's driver and launcher speak gRPC to it, KFP's UI
gRPC-web (over HTTP/1.1, through its Node server's proxy).

No C++ MLMD server is packaged. The wheel carries the same C++ store as a library: its
``MetadataStore`` with a sqlite ``ConnectionConfig`` dispatches every service method by name
to the store's C++ method, as the C++ server does. So each method of the service descriptor
is served by parsing ``<Method>Request``, calling ``MetadataStore._call_method`` (without the
client-side retry of ``_call``: clients retry Aborted themselves) and answering its
``<Method>Response``; MLMD's errors carry their canonical code, which becomes the gRPC
status (so NotFound, AlreadyExists, Aborted... reach KFP's Go client as the C++ server sends
them; e.g. GetContextByTypeAndName answers OK and an empty response for a missing type or
context, here as there: it is the same C++ code). Calls run one at a time under a lock (the
C++ server took a writer lock per call too), so the one sqlite connection is never shared.

Runs in the venv of build_mlmd.sh (mlmd.py starts it)::

    python mlmd_server.py --db PATH --grpc HOST:PORT --grpc-web HOST:PORT
"""

from __future__ import annotations

import argparse
import base64
import logging
import signal
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
from google.protobuf import message_factory
from ml_metadata import errors
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2, metadata_store_service_pb2

SERVICE = "ml_metadata.MetadataStoreService"

#: What KFP 2.17's driver, launcher and UI call; the server refuses to start without them.
KFP_METHODS = (
    "GetContextByTypeAndName", "GetContextType", "PutContextType", "PutContexts",
    "GetContextsByID", "GetParentContextsByContext", "PutParentContexts", "PutExecutionType",
    "PutExecution", "GetExecutionsByID", "GetExecutionByTypeAndName", "GetExecutionsByContext",
    "GetContextsByExecution", "GetEventsByExecutionIDs", "GetEventsByArtifactIDs",
    "GetArtifactsByID", "GetArtifactType", "PutArtifactType", "PutArtifacts",
    "GetArtifactsByURI", "GetContextsByArtifact", "GetArtifactTypes", "GetArtifactTypesByID",
    "GetExecutionTypes", "GetExecutionTypesByID", "GetArtifacts", "GetExecutions",
    "GetArtifactsByContext",
)  # fmt: skip

OK, UNIMPLEMENTED, INTERNAL = 0, 12, 13
GRPC_CODES = {code.value[0]: code for code in grpc.StatusCode}

log = logging.getLogger("mlmd")


class Store:
    """One MetadataStore on a sqlite file, called one method at a time."""

    def __init__(self, db: Path) -> None:
        config = metadata_store_pb2.ConnectionConfig()
        config.sqlite.filename_uri = str(db)
        config.sqlite.connection_mode = (
            metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
        )
        self._store = metadata_store.MetadataStore(config)
        self._lock = threading.Lock()
        service = metadata_store_service_pb2.DESCRIPTOR.services_by_name["MetadataStoreService"]
        self.methods = {m.name: m for m in service.methods}
        # _call_method looks the method up in the pybind11 module by name; a few of the
        # service's methods are not in 1.17.1's module.
        native = metadata_store.metadata_store_serialized
        self.implemented = {name for name in self.methods if hasattr(native, name)}

    def call(self, name: str, payload: bytes) -> tuple[int, str, bytes]:
        """(status code, message, serialized response) of method ``name`` for ``payload``."""
        method = self.methods.get(name)
        if method is None:
            return UNIMPLEMENTED, f"unknown method {SERVICE}/{name}", b""
        if name not in self.implemented:
            return UNIMPLEMENTED, f"{name} is not implemented by ml-metadata's store", b""
        request = message_factory.GetMessageClass(method.input_type)()
        response = message_factory.GetMessageClass(method.output_type)()
        try:
            request.ParseFromString(payload)
        except Exception as err:  # protobuf's DecodeError, or worse
            return INTERNAL, f"cannot parse {method.input_type.name}: {err}", b""
        try:
            with self._lock:
                self._store._call_method(name, request, response)
        except errors.StatusError as err:
            return err.error_code, err.message, b""
        except Exception as err:
            log.exception("%s raised", name)
            return INTERNAL, f"{name}: {err}", b""
        return OK, "", response.SerializeToString()


def serve_call(store: Store, name: str, payload: bytes, via: str) -> tuple[int, str, bytes]:
    """store.call with the per-call log line (debug) and failures logged, as the C++ server
    logs them."""
    start = time.monotonic()
    code, message, response = store.call(name, payload)
    took_ms = (time.monotonic() - start) * 1000
    log.debug("%s %s: status %d (%.1f ms)", via, name, code, took_ms)
    if code != OK:  # MLMD's messages span lines (protos in text format): one line here
        log.warning("%s failed (status %d): %s", name, code, " ".join(message.split()))
    return code, message, response


def check_methods(store: Store) -> None:
    """Refuses to serve without what KFP needs; notes what the library lacks."""
    missing = [name for name in KFP_METHODS if name not in store.implemented]
    if missing:
        raise SystemExit(f"ml-metadata's store lacks methods KFP needs: {', '.join(missing)}")
    absent = sorted(set(store.methods) - store.implemented)
    if absent:
        log.info("answering UNIMPLEMENTED (not in the library): %s", ", ".join(absent))


# --- gRPC ---------------------------------------------------------------------------------


def grpc_handler(store: Store) -> grpc.GenericRpcHandler:
    """Unary handlers for every unary method of the service, on raw bytes: Store parses."""

    def unary(name: str) -> Callable[[bytes, grpc.ServicerContext], bytes]:
        def handle(payload: bytes, context: grpc.ServicerContext) -> bytes:
            code, message, response = serve_call(store, name, payload, "grpc")
            if code != OK:
                context.abort(GRPC_CODES.get(code, grpc.StatusCode.UNKNOWN), message)
            return response

        return handle

    handlers: dict[str, grpc.RpcMethodHandler] = {}
    for name, method in store.methods.items():
        if method.client_streaming or method.server_streaming:
            log.info("not serving streaming method %s (UNIMPLEMENTED)", name)
            continue  # gRPC answers UNIMPLEMENTED for methods without a handler
        handlers[name] = grpc.unary_unary_rpc_method_handler(unary(name))
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


def start_grpc(store: Store, address: str) -> grpc.Server:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="grpc"),
        # gRPC Python sets SO_REUSEPORT by default: a second server on a taken port would
        # silently share it instead of failing.
        options=[("grpc.so_reuseport", 0)],
    )
    server.add_generic_rpc_handlers((grpc_handler(store),))
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as err:  # how recent grpcio reports a failed bind
        raise SystemExit(f"cannot listen on {address} for gRPC: {err}") from err
    if bound == 0:
        raise SystemExit(f"cannot listen on {address} for gRPC")
    server.start()
    return server


# --- gRPC-web (grpc/grpc doc/PROTOCOL-WEB.md) --------------------------------------------

WEB_TYPES = (
    "application/grpc-web",
    "application/grpc-web+proto",
    "application/grpc-web-text",
    "application/grpc-web-text+proto",
)
TRAILER_FLAG = 0x80
# grpc-message is percent-encoded: printable ASCII other than '%' stays as it is.
MESSAGE_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def frame(flag: int, data: bytes) -> bytes:
    return struct.pack(">BI", flag, len(data)) + data


def request_message(body: bytes) -> bytes:
    """The one uncompressed data frame a unary request carries."""
    if len(body) < 5:
        raise ValueError("request body is not a gRPC-web frame")
    flag, length = struct.unpack(">BI", body[:5])
    if flag != 0:
        raise ValueError(f"unsupported request frame flag {flag:#x} (compressed or trailer)")
    if len(body) != 5 + length:
        raise ValueError("request body is not exactly one gRPC-web frame")
    return body[5:]


def decode_text(body: bytes) -> bytes:
    """grpc-web-text: base64, possibly several padded chunks one after another; each group
    of four characters decodes on its own."""
    text = b"".join(body.split())
    return b"".join(base64.b64decode(text[i : i + 4]) for i in range(0, len(text), 4))


def encode_message(message: str) -> str:
    return urllib.parse.quote(message, safe=MESSAGE_SAFE)


class WebServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: Store) -> None:
        super().__init__(address, WebHandler)
        self.store = store


class WebHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every response has a Content-Length
    server: WebServer

    def do_OPTIONS(self) -> None:
        # CORS preflight: whatever the browser asks for. KFP's UI comes through its own
        # server's proxy (same origin); this covers a direct call.
        self.send_response(204)
        self._cors_headers()
        self.send_header("Access-Control-Allow-Methods", "POST, OPTIONS")
        asked = self.headers.get("Access-Control-Request-Headers")
        self.send_header(
            "Access-Control-Allow-Headers",
            asked or "content-type,x-grpc-web,x-user-agent,grpc-timeout,authorization",
        )
        self.send_header("Access-Control-Max-Age", "86400")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        body = self._read_body()
        prefix = f"/{SERVICE}/"
        path = self.path.split("?", 1)[0]
        if not path.startswith(prefix):
            self._plain(404, f"not a {SERVICE} method\n")
            return
        content_type = self.headers.get("Content-Type", "")
        if content_type.split(";", 1)[0].strip().lower() not in WEB_TYPES:
            self._plain(415, "expected application/grpc-web(-text)(+proto)\n")
            return
        text = content_type.lower().startswith("application/grpc-web-text")
        try:
            payload = request_message(decode_text(body) if text else body)
        except ValueError as err:
            self._reply(content_type, text, INTERNAL, str(err), b"")
            return
        code, message, response = serve_call(self.server.store, path[len(prefix) :], payload, "web")
        self._reply(content_type, text, code, message, response)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";", 1)[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after each chunk
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _reply(self, content_type: str, text: bool, code: int, message: str, data: bytes) -> None:
        """200 with a data frame (on success) and the trailer frame. A failure is a
        trailers-only response besides: the status in the headers too."""
        trailer = f"grpc-status:{code}\r\ngrpc-message:{encode_message(message)}\r\n"
        body = (frame(0, data) if code == OK else b"") + frame(TRAILER_FLAG, trailer.encode())
        if text:
            body = base64.b64encode(body)
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        if code != OK:
            self.send_header("grpc-status", str(code))
            self.send_header("grpc-message", encode_message(message))
        self._cors_headers()
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _plain(self, status: int, text: str) -> None:
        log.warning("web %s %s: %d %s", self.command, self.path, status, text.strip())
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _cors_headers(self) -> None:
        origin = self.headers.get("Origin")
        self.send_header("Access-Control-Allow-Origin", origin or "*")
        if origin:
            self.send_header("Access-Control-Allow-Credentials", "true")
            self.send_header("Vary", "Origin")
        self.send_header("Access-Control-Expose-Headers", "grpc-status,grpc-message")

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # serve_call logs each call

    def log_message(self, format: str, *args: object) -> None:
        log.warning("web %s: " + format, self.client_address[0], *args)


def start_web(store: Store, address: str) -> WebServer:
    host, port = split_address(address)
    try:
        server = WebServer((host, port), store)
    except OSError as err:
        raise SystemExit(f"cannot listen on {address} for gRPC-web: {err}") from err
    threading.Thread(target=server.serve_forever, name="grpc-web", daemon=True).start()
    return server


# --- main ---------------------------------------------------------------------------------


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, required=True, help="the sqlite file (made if absent)")
    parser.add_argument("--grpc", required=True, help="HOST:PORT for gRPC")
    parser.add_argument("--grpc-web", required=True, help="HOST:PORT for gRPC-web")
    parser.add_argument("--log-level", default="INFO", help="DEBUG logs every call")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    args.db.parent.mkdir(parents=True, exist_ok=True)
    store = Store(args.db)
    check_methods(store)
    grpc_server = start_grpc(store, args.grpc)
    web_server = start_web(store, args.grpc_web)
    log.info("serving %s on %s (gRPC) and %s (gRPC-web), store %s", SERVICE, args.grpc,
             args.grpc_web, args.db)  # fmt: skip
    stop.wait()
    log.info("stopping")
    web_server.shutdown()
    grpc_server.stop(grace=5).wait()
    log.info("stopped")


if __name__ == "__main__":
    main()
