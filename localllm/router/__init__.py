"""``localllm serve`` with no model: every model of ``localllm list`` by name, each
loaded on demand in a process of its own, as Ollama and llama-server's router do.

- ``catalog``: the served models, found by name through the registry (never as a path);
- ``children``: one model's ``serve`` process: start, its URL, its log, its stop;
- ``pool``: which models are loaded (on demand, ``--models-max``, least recently
  used out first, ``keep_alive``);
- ``proxy``: the ASGI app: the key check, the router's own answers, the rest
  proxied to the model's child and streamed back;
- ``listing``: ``/v1/models``, ``/api/tags`` and ``/api/ps`` without loading anything;
- ``residency``: whether a model fits beside the loaded ones, by the memory plan,
  and which idle ones to unload for it;
- ``manage``: Ollama's ``/api/pull`` and ``/api/delete``, through localllm's own
  pull and rm (``store.pulling``, ``store.removal``);
- ``durations``: Ollama's ``keep_alive`` values;
- ``server``: uvicorn, signals, and stopping the children on the way out.

It builds on ``localllm.serve`` (the children are serve processes; the router
reuses its bounded HTTP protocol, its stopping rules and its error shapes) and
on ``localllm.store``; no Textual, no argparse: ``localllm.commands.serve`` turns
the command line into ``server.Settings``.
"""
