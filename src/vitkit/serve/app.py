"""The FastAPI application of `vitkit serve`: the JSON API, the page and its figures.

Routes: `GET /healthz`, `GET /api/model`, `POST /api/predict`, `POST /api/explain`,
`GET /api/figures/{name}.png`, `GET /` (the page) and `GET /static/...` (its files). Every
error is JSON `{"error": "..."}` with a 4xx status saying what is wrong and how to fix it
(docs/serve.md lists them); bad input never gives a 500 and the server keeps serving.

With a `token`, every `/api/` route needs `Authorization: Bearer TOKEN` (or `?token=TOKEN`,
for the page's <img> tags, which cannot send headers); `/healthz`, the page and its static
files stay open (they hold nothing of the model).

Why FastAPI (Starlette) and uvicorn rather than gradio: the main product is a JSON API other
programs call, with our own error statuses; the dynamic batching is ours to control
(`vitkit.serve.batching`) rather than a UI framework's queue; and the page must work offline
from a few static files, without gradio's frontend bundle.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from vitkit.errors import ConfigError, VitkitError
from vitkit.serve.batching import DynamicBatcher, QueueFull
from vitkit.serve.panels import FIGURES, figure_png
from vitkit.serve.service import ModelService
from vitkit.serve.uploads import (
    DECODES_IN_FLIGHT,
    TRIM_PIXELS,
    DecodeBudget,
    Form,
    PixelLimits,
    UploadError,
    check_sizes,
    decode_files,
    read_form,
    release_memory,
)

__all__ = ["STATIC", "create_app"]

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
RETRY_AFTER_S = 1  # what a 503 (the server busy) asks the client to wait
ROUTES = ("GET /healthz, GET /api/model, POST /api/predict, POST /api/explain, "
          "GET /api/figures/NAME.png, GET /")
NO_PAGE = ("<!doctype html><title>vitkit serve</title><p>This build of vitkit has no page "
           "(vitkit/serve/static is missing). The JSON API works: see docs/serve.md "
           "(<code>curl -F file=@image.png http://HOST:PORT/api/predict</code>).</p>")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def _field(form: Form, name: str, default: Any, kind: type, hint: str) -> Any:
    """A form value converted to `kind`, `default` when absent; 400 naming it when not."""
    text = form.fields.get(name, "").strip()
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise UploadError(400, f"form field {name}={text!r} is not {hint}") from None


def _token_ok(request: Request, token: str) -> bool:
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer":
        given = request.query_params.get("token", "")
    return hmac.compare_digest(given.strip().encode(), token.encode())


def create_app(service: ModelService, *, max_batch: int = 8, max_wait_ms: float = 5.0,
               token: str | None = None, max_upload_mb: float = 20.0,
               max_pixels: int | None = None, max_queue: int | None = None) -> FastAPI:
    """The app serving `service`: requests batched up to `max_batch` inputs or `max_wait_ms`
    (max_batch 1: no batching), bodies refused over `max_upload_mb`, images over `max_pixels`
    (default: `default_max_pixels` of the model's input) and requests over `max_batch` times
    that refused from their headers before decoding, at most `DECODES_IN_FLIGHT` images of
    that size decoded at once, `/api/` behind `token` when one is given, at most `max_queue`
    requests waiting for the model (503 past it; default: `default_max_queue`)."""
    if not (math.isfinite(max_upload_mb) and max_upload_mb > 0):
        raise ConfigError(f"max_upload_mb must be a finite number > 0, got {max_upload_mb}")
    if token is not None and not token.strip():
        raise ConfigError("the token is empty, which would let anyone in: give a long random "
                          "one, or token=None to serve without one")
    limits = PixelLimits.checked(max_pixels, max_batch, service.preprocess.img_size)
    budget = DecodeBudget(DECODES_IN_FLIGHT * limits.per_image)
    batcher: DynamicBatcher = DynamicBatcher(service.forward, max_batch, max_wait_ms, max_queue)
    max_bytes = int(max_upload_mb * 2**20)
    settings = {"max_batch": max_batch, "max_wait_ms": max_wait_ms, "max_upload_mb": max_upload_mb,
                "max_pixels": limits.per_image, "max_request_pixels": limits.per_request,
                "max_queue": batcher.max_queue}

    async def decode(form: Form, most: int | None = None) -> list[tuple[str, Any]]:
        """The form's files decoded, after `check_sizes`, while holding the decode budget;
        the memory handed back after a large decode."""
        largest = await asyncio.to_thread(check_sizes, form, service.preprocess,
                                          service.inputs, limits, most)
        try:
            async with budget.hold(largest):
                return await asyncio.to_thread(decode_files, form, service.preprocess,
                                               service.inputs, most, limits)
        finally:
            if largest >= TRIM_PIXELS:
                await asyncio.to_thread(release_memory)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await batcher.close()  # requests still queued get their answers first

    app = FastAPI(title="vitkit serve", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)  # the interactive docs load their assets from a CDN
    app.state.service, app.state.batcher, app.state.decode_budget = service, batcher, budget
    app.state.settings = {**settings, "token": token is not None}
    _add_errors(app)

    if token:
        @app.middleware("http")
        async def bearer(request: Request, call_next: Any) -> Response:
            if request.url.path.startswith("/api/") and not _token_ok(request, token):
                return _error(401, "missing or wrong token: send the header 'Authorization: "
                                   "Bearer TOKEN' with the token the server was started with "
                                   "(--token), or open the page as /?token=TOKEN with the token "
                                   "URL-encoded (a + as %2B)", {"WWW-Authenticate": "Bearer"})
            return await call_next(request)

    @app.api_route("/healthz", methods=["GET", "HEAD"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/api/model")
    async def model() -> dict[str, Any]:
        return {**service.describe(), **settings, "figures": list(FIGURES),
                "batches": {"run": batcher.stats.batches, "inputs": batcher.stats.inputs,
                            "largest": batcher.stats.largest}}

    @app.post("/api/predict")
    async def predict(request: Request) -> dict[str, Any]:
        form = await read_form(request, max_bytes)
        topk = _field(form, "topk", 5, int, "a whole number (the classes per image)")
        if topk < 1:
            raise UploadError(400, f"topk must be >= 1, got {topk}")
        items = await decode(form)
        outputs = await batcher.submit([image for _, image in items])
        return {"predictions": service.answers([name for name, _ in items], outputs, topk)}

    @app.post("/api/explain")
    async def explain(request: Request) -> dict[str, Any]:
        form = await read_form(request, max_bytes)
        layer = _field(form, "layer", None, int, "a layer number")
        head = form.fields.get("head", "").strip() or "all"
        ratio = _field(form, "discard_ratio", 0.0, float, "a number in [0, 1)")
        fusion = form.fields.get("fusion", "").strip() or "mean"
        layer, head = service.check_explain(layer, head, ratio, fusion)
        items = await decode(form, 1)
        if len(items) > 1:
            raise UploadError(422, f"{form.files[0].name} holds {len(items)} images; explain "
                                   "takes one: send one image (an array of shape (C, H, W))")
        name, image = items[0]
        return await batcher.run_alone(service.explain, image, name, layer, head, ratio,
                                       fusion)

    @app.get("/api/figures/{name}.png")
    async def figure(name: str) -> Response:
        if name not in FIGURES:
            return _error(404, f"no figure {name!r}: the figures are {', '.join(FIGURES)}")
        png = await batcher.run_alone(figure_png, service, name)
        return Response(png, media_type="image/png")

    _add_page(app)
    return app


def _add_page(app: FastAPI) -> None:
    """`GET /` (the page, or a note when this build has none) and `/static/`."""
    page = STATIC / "index.html"
    if STATIC.is_dir():
        app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> Response:
        return FileResponse(page) if page.is_file() else HTMLResponse(NO_PAGE)


def _add_errors(app: FastAPI) -> None:
    """Every error as JSON {"error": ...}: uploads and bad values 4xx, unknown routes 404,
    anything else a 500 that says it is a bug (logged with its traceback)."""

    @app.exception_handler(UploadError)
    async def upload_error(_: Request, exc: UploadError) -> JSONResponse:
        return _error(exc.status, exc.message)

    @app.exception_handler(QueueFull)
    async def queue_full(_: Request, exc: QueueFull) -> JSONResponse:
        return _error(503, f"the server is busy: {exc}; retry after {RETRY_AFTER_S} s",
                      {"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(VitkitError)
    async def vitkit_error(_: Request, exc: VitkitError) -> JSONResponse:
        return _error(400, str(exc))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error(400, f"bad request: {exc.errors()}")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 404:
            return _error(404, f"no route {request.method} {request.url.path}: the routes are "
                               f"{ROUTES}")
        if exc.status_code == 405:
            return _error(405, f"{request.method} is not allowed on {request.url.path}: the "
                               f"routes are {ROUTES}")
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:
        log.exception("error serving %s %s", request.method, request.url.path)
        return _error(500, f"internal error ({type(exc).__name__}: {exc}); this is a bug in "
                           "vitkit serve: please report it with the request that caused it")
