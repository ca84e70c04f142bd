"""The ASGI app of `tfrecipe serve` (Starlette): TF Serving's REST API for one model.

    GET  /v1/models/NAME                   {"model_version_status": [{"version": "1",
                                             "state": "AVAILABLE", ...}]}
    GET  /v1/models/NAME/metadata          the signature, in TF Serving's shape, and
                                           signature.json itself under "tfrecipe"
    POST /v1/models/NAME:predict           {"instances": ...} | {"inputs": ...}
    (and the same under /v1/models/NAME/versions/1)

Requests are queued and run in batches by one model thread (`Batcher`): whatever arrives while
the model computes goes into its next call, and each request gets back its own rows. Bodies
above `max_body` bytes get 413 (read and dropped, never kept), another model name 404, a GET of
:predict 405, a request the model cannot take 400 with `tfrecipe predict`'s line (another
`signature_name` than "serving_default" too), any other path or method 404 or 405: each a JSON
{"error": ...}. The app writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tfrecipe.cli import serve_rest

VERSION = "1"
# Rows one model call takes from the queue (more wait for the next; one larger request goes
# alone, whole).
MAX_BATCH_ROWS = 1024


@dataclasses.dataclass(frozen=True)
class Served:
    """What the app serves.

    Attributes:
      name: the model's name in the URLs.
      reading: how requests are read (the run's signature and missing-value markers).
      predict: features (as parsed) -> the model's outputs, rows first; called from one thread.
      decode: outputs -> `tfrecipe predict`'s columns.
      metadata: the answer to GET .../metadata.
      max_body: the largest request body taken, in bytes.
    """

    name: str
    reading: serve_rest.Reading
    predict: Callable[[Any], np.ndarray]
    decode: Callable[[np.ndarray], Mapping[str, np.ndarray]]
    metadata: Mapping[str, Any]
    max_body: int


class Batcher:
    """Requests queued and run in batches on one thread: concurrent requests never share a
    model call's state, and each gets its own rows back."""

    def __init__(self, predict: Callable[[Any], np.ndarray]):
        self._predict = predict
        self._queue: asyncio.Queue | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfrecipe-serve")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def outputs(self, request: serve_rest.Request) -> np.ndarray:
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((request, future))
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            group = [await self._queue.get()]
            rows = group[0][0].rows
            while not self._queue.empty() and rows < MAX_BATCH_ROWS:
                group.append(self._queue.get_nowait())
                rows += group[-1][0].rows
            try:
                batch = _concatenated([request.features for request, _ in group])
                outputs = await loop.run_in_executor(self._executor, self._predict, batch)
            except Exception as error:  # the model failed: every waiting request hears it
                for _, future in group:
                    if not future.done():
                        future.set_exception(error)
                continue
            start = 0
            for request, future in group:
                if not future.done():  # its client may have left
                    future.set_result(outputs[start : start + request.rows])
                start += request.rows


def _concatenated(batches: list) -> Any:
    if len(batches) == 1:
        return batches[0]
    if isinstance(batches[0], dict):
        return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}
    return np.concatenate(batches)


def build(served: Served):
    """The Starlette app serving `served`."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    handlers = _Handlers(served)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        handlers.batcher.start()
        yield
        await handlers.batcher.stop()

    routes = []
    for prefix in ("/v1/models/{name}", "/v1/models/{name}/versions/{version}"):
        routes += [
            Route(prefix, handlers.status, methods=["GET"]),
            Route(prefix + "/metadata", handlers.metadata, methods=["GET"]),
            Route(prefix + ":predict", handlers.predict, methods=["POST"]),
        ]
    # every other path or method (TF Serving's :classify, a version label) answers in JSON, as
    # every refusal here does: Starlette's own answer is plain text, which TF Serving's clients
    # fail to parse
    refusals = {HTTPException: handlers.not_served}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=refusals)


class _Handlers:
    """The endpoints of one served model."""

    def __init__(self, served: Served):
        self.served = served
        self.batcher = Batcher(served.predict)

    def _refused(self, params: Mapping[str, str]):
        """404 for another model or version, else None."""
        name = self.served.name
        if params["name"] != name or params.get("version", VERSION) != VERSION:
            version = f" version {params['version']}" if "version" in params else ""
            return _error(
                404,
                f"model {params['name']!r}{version} is not served here; this server serves "
                f"{name!r} version {VERSION}",
            )
        return None

    async def not_served(self, request, error):
        """404 or 405 (Starlette's `error`) for what no route takes, naming what they take."""
        base = f"/v1/models/{self.served.name}"
        return _error(
            error.status_code,
            f"{request.method} {request.url.path}: {error.detail}; this server answers GET "
            f"{base}, GET {base}/metadata and POST {base}:predict",
            headers=error.headers,
        )

    async def status(self, request):
        from starlette.responses import JSONResponse

        if request.url.path.endswith(":predict"):  # a GET of predict: its name matched `{name}`
            return _error(405, "the :predict endpoint takes POST", headers={"Allow": "POST"})
        return self._refused(request.path_params) or JSONResponse(_status())

    async def metadata(self, request):
        from starlette.responses import JSONResponse

        return self._refused(request.path_params) or JSONResponse(self.served.metadata)

    async def predict(self, request):
        from starlette.responses import Response

        refused = self._refused(request.path_params)
        if refused is not None:
            return refused
        body = await _body(request, self.served.max_body)
        if body is None:
            return _error(413, f"the request body is over --max-body={self.served.max_body} bytes")
        try:
            parsed = serve_rest.parse(body, self.served.reading)
        except serve_rest.BadRequest as error:
            return _error(400, str(error))
        outputs = await self.batcher.outputs(parsed)
        answer = serve_rest.response(outputs, self.served.decode(outputs), parsed.format)
        # An output past float32 (inputs far out of the training range) is written as TF Serving
        # writes it, the bare NaN, Infinity or -Infinity that Python's json reads back; Starlette's
        # JSONResponse refuses them (the client got a 500)
        body = json.dumps(answer, allow_nan=True, separators=(",", ":"))
        return Response(body, media_type="application/json")


def _status() -> dict:
    return {
        "model_version_status": [
            {
                "version": VERSION,
                "state": "AVAILABLE",
                "status": {"error_code": "OK", "error_message": ""},
            }
        ]
    }


def _error(status: int, message: str, headers: Mapping[str, str] | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def _body(request, limit: int) -> bytes | None:
    """The body, or None when it is over `limit` bytes: then read to its end and dropped (a
    client still sending would otherwise see its connection reset instead of the 413)."""
    declared = request.headers.get("content-length", "")
    over = declared.isdigit() and int(declared) > limit
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        over = over or size > limit
        if not over:
            chunks.append(chunk)
    return None if over else b"".join(chunks)
