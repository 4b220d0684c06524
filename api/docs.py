"""``/docs`` without the network: Swagger UI's JavaScript, CSS and
icon are served by the app from the ``swagger-ui-bundle-v2`` package (Swagger UI 5, which
renders OpenAPI 3.1), never from a CDN, so the docs work on an offline machine."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

#: Where the Swagger UI assets are served (under the app's root path).
ASSETS_PATH = "/docs/assets"


def install(app: FastAPI) -> None:
    """Serve ``GET /docs`` (Swagger UI on ``app.openapi_url``) and its assets at
    :data:`ASSETS_PATH`. Call on an app made with ``docs_url=None`` (FastAPI's own
    ``/docs`` page loads the assets from a CDN)."""
    app.mount(ASSETS_PATH, StaticFiles(directory=str(swagger_ui_path)), name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} · API docs",
            swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/favicon-32x32.png",
        )
