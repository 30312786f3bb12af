"""``localllm serve``: an OpenAI-compatible HTTP server with continuous batching.

- ``scheduler``: the engine thread (slots, chunked prefill, prefix reuse, stop strings);
  it drives ``localllm.engine.batch`` and never imports llama_cpp itself;
- ``protocol``: request validation and OpenAI-shaped responses (pure Python);
- ``prometheus``: counters and histograms in the Prometheus text format;
- ``app``: the Starlette routes, auth and body limits;
- ``llama_routes``: llama-server's own routes (/completion, /tokenize, /props, ...);
- ``ollama``: Ollama's API (/api/chat, /api/generate, /api/tags, ...);
- ``cors``: --cors, outside the API-key check.
"""
