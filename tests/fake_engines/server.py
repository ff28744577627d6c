"""A loopback HTTP server with the engines' profiler routes, driving a stand-in engine.

vLLM (``vllm/entrypoints/serve/profile/api_router.py``): ``POST /start_profile`` with an
optional JSON body (``StartProfileRequest``: profile_prefix, delay_iterations,
max_iterations, profiler_kwargs) and ``POST /stop_profile``, both present only when the
server was launched with a profiler; a second start answers 409. SGLang
(``srt/entrypoints/http_server.py``): ``/start_profile`` (a ``ProfileReq`` body) and
``/stop_profile``, GET or POST; an engine error is a 500.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from fake_engines import sglang, vllm

VLLM_START_FIELDS = ("profile_prefix", "delay_iterations", "max_iterations", "profiler_kwargs")


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, *args: Any) -> None:  # quiet tests
        pass

    def _body(self) -> dict[str, Any]:
        size = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(size) if size else b""
        return json.loads(raw) if raw.strip() else {}

    def _answer(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        self.server.handle_route(self, "POST")

    def do_GET(self) -> None:
        self.server.handle_route(self, "GET")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, engine: str, target: Any) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.engine = engine
        self.target = target
        self.loop = asyncio.new_event_loop()  # vLLM's AsyncLLM lives on the server's loop
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.lock = threading.Lock()

    def handle_route(self, handler: _Handler, method: str) -> None:
        path = handler.path.split("?")[0]
        if path not in ("/start_profile", "/stop_profile"):
            handler._answer(404, "Not Found")
            return
        if self.engine == "vllm":
            self._vllm(handler, method, path)
        else:
            self._sglang(handler, path)

    def _vllm(self, handler: _Handler, method: str, path: str) -> None:
        llm: vllm.AsyncLLM = self.target
        if not llm.workers.config.get("profiler"):
            handler._answer(404, '{"detail":"Not Found"}')  # the router is not included
            return
        if method != "POST":
            handler._answer(405, '{"detail":"Method Not Allowed"}')
            return
        body = handler._body()
        self.requests.append(("vllm", path, body))
        kwargs = {k: v for k, v in body.items() if k in VLLM_START_FIELDS and v is not None}
        call = llm.start_profile(**kwargs) if path == "/start_profile" else llm.stop_profile()
        try:
            with self.lock:
                self.loop.run_until_complete(call)
        except vllm.ProfilerAlreadyActiveError as err:
            handler._answer(409, json.dumps({"error": {"message": str(err)}}))
            return
        handler._answer(200, "")

    def _sglang(self, handler: _Handler, path: str) -> None:
        engine: sglang.Engine = self.target
        body = handler._body()
        self.requests.append(("sglang", path, body))
        try:
            if path == "/start_profile":
                body.pop("req_type", None)
                engine.schedulers.start(sglang.ProfileReq(**body))
                handler._answer(200, "Start profiling.\n")
            else:
                engine.schedulers.stop()
                handler._answer(200, "Stop profiling. This will take some time.\n")
        except RuntimeError:
            handler._answer(500, "Internal Server Error")


@contextmanager
def serving(engine: str, target: Any) -> Iterator[tuple[str, _Server]]:
    """Serve ``target`` (a stand-in AsyncLLM for vllm, Engine for sglang) on 127.0.0.1."""
    server = _Server(engine, target)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()
        server.loop.close()
