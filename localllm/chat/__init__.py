"""Chat: a session over any ``Engine`` (``session``), saved sessions
(``sessions``), and speculative decoding (``speculative``)."""
