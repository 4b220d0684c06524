"""A local stand-in for an OpenAI-compatible voice endpoint, spoken over real HTTP.

``POST /v1/audio/speech`` answers ``FAKEMP3:`` + the input text as ``audio/mpeg``;
``POST /v1/audio/transcriptions`` answers ``{"text": TRANSCRIPT}`` for any upload.
Every request (JSON body or form fields, and the uploaded file's bytes) is recorded.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TRANSCRIPT = "What did they decide?"


class VoiceStub:
    """The stub app and what it received."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.app = Starlette(
            routes=[
                Route("/v1/audio/speech", self.speech, methods=["POST"]),
                Route("/v1/audio/transcriptions", self.transcriptions, methods=["POST"]),
            ]
        )

    async def speech(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append({"path": "speech", **body})
        return Response(b"FAKEMP3:" + body["input"].encode(), media_type="audio/mpeg")

    async def transcriptions(self, request: Request) -> Response:
        form = await request.form()
        upload = form["file"]
        assert isinstance(upload, UploadFile)
        self.requests.append(
            {"path": "transcriptions", "model": form["model"], "audio": await upload.read()}
        )
        return JSONResponse({"text": TRANSCRIPT})
