"""The bare echo that the HTTP rows of bench/invoke_path.py compare with: a FastAPI app, nothing more.

Served by the uvicorn command line (``python -m uvicorn echo_app:app --app-dir bench``), once with
uvicorn's defaults (h11, asyncio) and once with httptools on uvloop.
"""

from fastapi import FastAPI, Request
from fastapi.responses import Response

app = FastAPI()


@app.post("/function/{fn}")
async def echo(fn: str, request: Request) -> Response:
    return Response(await request.body(), media_type="application/octet-stream")
