"""The cockpit's session, without its screen: the engine thread, the model's load
and rollback, the next message's count, a reply generated, the figures measured
on it, and the conversation saved (its KV cache kept and resumed).

``localllm.tui`` draws it with Textual; this package never imports Textual (a
test checks it), so it is tested with the scripted engine alone. It sits on the
one load path (``localllm.runtime``).
"""
