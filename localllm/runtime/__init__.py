"""One load path: every front end loads a model through here.

The sequence was written out by hand in the library, ``run``, ``chat``,
``doctor``, ``bench``, ``tune``, ``serve``, the smoke test and the cockpit, and
had drifted (a bare load with no memory check in one, no fit in another, the
header read three times, the default context decided in four places). Here it
is written once:

    request = LoadRequest(model="smollm2", options=fitting.LoadOptions(n_ctx=None))
    with open_model(request) as loaded:       # resolve, header once, fit, load, check
        loaded.engine.stream(...)

``plan`` and ``load`` are its two halves for a front end that speaks between
them (``run`` says how the fit changed the settings before it loads);
``reload_or_restore`` switches models and comes back to the previous one when
the new one fails (the cockpit). No Textual, no argparse, no I/O at import;
llama.cpp is imported only when an engine is made.
"""

from __future__ import annotations

from localllm.runtime.errors import DoesNotFit, NoImages
from localllm.runtime.loading import Loaded, load, new_engine, open_model
from localllm.runtime.planning import Planned, plan, prepare, resolve
from localllm.runtime.request import LoadRequest
from localllm.runtime.rollback import Previous, Switched, reload_or_restore

__all__ = [
    "DoesNotFit", "LoadRequest", "Loaded", "NoImages", "Planned", "Previous", "Switched", "load", "new_engine", "open_model", "plan",
    "prepare", "reload_or_restore", "resolve",
]
