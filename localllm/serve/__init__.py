"""``localllm serve``: an OpenAI-compatible HTTP server with continuous batching.

From a program::

    from localllm import runtime
    from localllm.serve import Server, ServeOptions

    with runtime.open_model(runtime.LoadRequest(model="smollm2", serving=True)) as loaded:
        with Server(loaded, ServeOptions(port=0)).start() as server:
            ...  # server.url: OpenAI, Anthropic, Ollama and llama-server routes

or ``serve(loaded, options)`` to serve until SIGINT. The modules:

- ``server``: ``Server`` and ``ServeOptions``, what the command and the library run;
- ``wiring``: a loaded model's pieces as the app's state (tokenizing, embeddings, facts);
- ``scheduler``: the engine thread (slots, chunked prefill, prefix reuse, stop strings);
  it drives ``localllm.engine.batch`` and never imports llama_cpp itself;
- ``protocol``: request validation and OpenAI-shaped responses (pure Python);
- ``prometheus``: counters and histograms in the Prometheus text format;
- ``app``: the Starlette routes, auth and body limits;
- ``llama_routes``: llama-server's own routes (/completion, /tokenize, /props, ...);
- ``ollama``: Ollama's API (/api/chat, /api/generate, /api/tags, ...);
- ``cors``: --cors, outside the API-key check.

Its names load on first use (PEP 562): ``server`` imports the scheduler and
the prompt cache, which a caller of one submodule need not pay for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ServeOptions", "Server", "serve"]

if TYPE_CHECKING:
    from localllm.serve.server import ServeOptions, Server, serve


def __getattr__(name: str) -> Any:
    if name in __all__:
        from localllm.serve import server  # lazy: see the module's docstring

        return getattr(server, name)
    raise AttributeError(f"module 'localllm.serve' has no attribute {name!r}")
