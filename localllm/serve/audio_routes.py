"""``POST /v1/audio/transcriptions`` (and llama-server's unprefixed alias): OpenAI's transcription form on an audio model.

As llama-server answers it (tools/server/server-chat.cpp,
``convert_transcriptions_to_chatcmpl``): the multipart form's ``file`` becomes
an ``input_audio`` part after the prompt (the form's ``prompt``, else "Transcribe
audio to text", with " (language: xx)" when ``language`` is given), and the
request runs as a chat completion, so the sound is bounded, decoded and encoded
as any request's (serve/media.py, ``audio.read``): a hostile file is a 400
before it reaches the engine thread. ``response_format`` is ``json`` (OpenAI's
``{"text", "usage"}`` with llama-server's ``"type": "transcript.text.done"``),
``text`` (the transcript alone) or ``verbose_json`` (OpenAI's verbose shape:
the clip's duration, and one segment spanning it, since the model gives no
timestamps). srt and vtt, and streaming, are refused by name.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from localllm.serve.body import read_body
from localllm.serve.media import AUDIO_FORMATS
from localllm.serve.protocol import OPENAI, RequestError

PATHS = ("/v1/audio/transcriptions", "/audio/transcriptions")
FORMATS = ("json", "text", "verbose_json")
DEFAULT_PROMPT = "Transcribe audio to text"  # llama-server's (common_chat_get_asr_prompt)
_FIELDS = 16  # form fields a request may hold (OpenAI's form has under ten)


def chat_body(fields: dict[str, str], audio: bytes, filename: str) -> tuple[dict, str]:
    """The chat completion a transcription form asks for, and its response_format; a RequestError (400) naming a bad field."""
    fmt = fields.get("response_format", "json") or "json"
    if fmt not in FORMATS:
        raise RequestError(400, f"'response_format' {fmt[:20]!r} is not supported here: one of {', '.join(FORMATS)}", param="response_format")
    if fields.get("stream", "false").lower() not in ("false", "0", ""):
        raise RequestError(400, "'stream' is not supported for transcriptions here: the transcript comes whole", param="stream")
    prompt = fields.get("prompt") or DEFAULT_PROMPT
    language = fields.get("language", "")
    if language:
        prompt += f" (language: {language[:32]})"
    suffix = filename.rsplit(".", 1)[-1].lower() if "." in filename else ""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": prompt},
            {"type": "input_audio", "input_audio": {"data": base64.b64encode(audio).decode(), **({"format": suffix} if suffix in AUDIO_FORMATS else {})},
             "_where": "file"},
        ]}],
        "stream": False,
    }
    for name, cast in (("temperature", float), ("max_tokens", int), ("seed", int)):
        if fields.get(name):
            try:
                body[name] = cast(fields[name])
            except ValueError:
                raise RequestError(400, f"'{name}' must be a number", param=name) from None
    return body, fmt


def shape(chat: dict, fmt: str, language: str, seconds: float | None) -> Response:
    """The chat completion ``chat`` as ``fmt``'s transcription."""
    text = chat["choices"][0]["message"].get("content") or ""
    u = chat.get("usage") or {}
    usage = {"type": "tokens", "input_tokens": u.get("prompt_tokens"), "output_tokens": u.get("completion_tokens"),
             "total_tokens": u.get("total_tokens"), "input_tokens_details": {"cached_tokens": (u.get("prompt_tokens_details") or {}).get("cached_tokens")}}
    if fmt == "text":
        return PlainTextResponse(text)
    if fmt == "verbose_json":
        segment: dict[str, Any] = {"id": 0, "seek": 0, "start": 0.0, "end": seconds, "text": text, "tokens": [], "temperature": 0.0,
                   "avg_logprob": None, "compression_ratio": None, "no_speech_prob": None}
        return JSONResponse({"task": "transcribe", "language": language or None, "duration": seconds, "text": text,
                             "segments": [segment], "usage": usage})
    return JSONResponse({"type": "transcript.text.done", "text": text, "usage": usage})


def routes(state: Any, generate: Callable[..., Awaitable[Response]], read_json: Callable[[Request], Awaitable[dict]]) -> list[Route]:
    """The routes, over ``state`` (``app.ServeState``) and the app's ``generate`` (``read_json``: unused, the body is a form)."""

    async def transcriptions(request: Request) -> Response:
        try:
            if not state.audio:
                raise RequestError(400, "this server's model takes no audio: start serve with --mmproj FILE (the model's audio projector)",
                                   code="not_supported")
            if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
                raise RequestError(400, "the body must be multipart/form-data with the sound in 'file' (OpenAI's transcription form)")
            request._body = await read_body(request, state.max_body)  # bounded first: Starlette's form parser then reads it from memory
            form = await request.form(max_files=1, max_fields=_FIELDS, max_part_size=state.max_body)
            upload = form.get("file")
            if upload is None or isinstance(upload, str):
                raise RequestError(400, "'file' is missing: send the sound file as the form's 'file' part", param="file")
            audio = await upload.read()
            if not audio:
                raise RequestError(400, "'file' is empty", param="file")
            fields = {k: v for k, v in form.items() if isinstance(v, str)}
            body, fmt = chat_body(fields, audio, upload.filename or "")
        except RequestError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        except Exception as exc:  # python-multipart's own refusals: a malformed form, too many fields
            return JSONResponse(RequestError(400, f"the form could not be read: {exc}"[:300]).body(), status_code=400)
        resp = await generate(request, True, OPENAI, body=body)
        if resp.status_code != 200:
            return resp
        from starlette.concurrency import run_in_threadpool  # lazy: as app's generate imports it

        from localllm.audio.read import decode_audio  # lazy: the clip's length for verbose_json (read already: bounded)

        # off the event loop, as the request's own decode was: a 32 MiB WAV takes a moment
        seconds = round((await run_in_threadpool(decode_audio, audio, name="file")).seconds, 3) if fmt == "verbose_json" else None
        return shape(json.loads(bytes(resp.body)), fmt, fields.get("language", ""), seconds)

    return [Route(p, transcriptions, methods=["POST"]) for p in PATHS]
