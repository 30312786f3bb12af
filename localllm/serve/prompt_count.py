"""The token count of a request's prompt, as ``generate`` would read it: for
Anthropic's ``/v1/messages/count_tokens`` and the Responses API's
``/v1/responses/input_tokens``, which answer how long a prompt is without
generating. The same translation, checks and chat template as the generating
route (tools rendered as the template renders them), so the count is the
prompt the model would be given, token for token."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from localllm.serve.protocol import GenParams, RequestError


async def count(state, params: GenParams) -> int:
    """Tokens of ``params``' prompt under ``state``'s (``app.ServeState``) tokenizer and chat template."""
    try:
        tokens = await run_in_threadpool(state.tokenize, params)
    except RequestError:
        raise
    except Exception as exc:  # a chat template that refuses these messages (jinja raises): the client's messages, a 400
        raise RequestError(400, f"the chat template refused these messages: {type(exc).__name__}: {exc}"[:500]) from None
    return len(tokens)
