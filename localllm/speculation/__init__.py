"""Draftless speculative decoding: drafts from the conversation itself, kept only
where they are what the model samples.

Decode is memory-bound: a batch of a few tokens costs about one token's pass
over the weights. So the tokens that would come next if the reply goes on
quoting what came before (an n-gram of the prompt or the reply seen before:
``ngram``, llama.cpp's ``--spec-type ngram-mod`` idea) are evaluated with the
current token in one batch, and the model samples each position in turn: a
drafted token is kept only when it equals the token sampled there, so the reply
is the one without speculation, token for token, for every sampler (greedy or
seeded), just sooner where the drafts are right. ``control`` turns the drafting
off for a sequence whose drafts are rarely right (a rejected batch costs more
than one token) and on again when they would be.

Pure Python: the engine's generation loop asks it for drafts and tells it the
tokens; the index and the controller are tested in milliseconds.
"""

from localllm.speculation.control import MODES, Controller, line, rows, verify
from localllm.speculation.drafting import Drafting
from localllm.speculation.history import Replies
from localllm.speculation.ngram import NgramIndex

__all__ = ["MODES", "Controller", "Drafting", "NgramIndex", "Replies", "line", "rows", "verify"]
