"""Post-install smoke test: load the default model and decode a few tokens.

``scripts/install.sh`` runs this in a child process right after building
llama-cpp-python: a build with the wrong CPU flags (AMX, llama.cpp #20824)
crashes at the first decode, and that should surface at install time, not at
the user's first ``localllm run``. Exit 0 and one line on success.
"""

from __future__ import annotations

import sys

from localllm import runtime
from localllm.engine_api import SamplingConfig
from localllm.plan import fitting
from localllm.util import fmt


def main() -> int:
    # lazy: loads gguf, llama.cpp, numpy (~155 ms here), which smoke does not load at import
    from localllm.engine import system_info

    # the default model through the load path every command takes: a build that crashes there crashes here first
    with runtime.open_model(runtime.LoadRequest(options=fitting.LoadOptions(n_ctx=256))) as loaded:
        backend = loaded.engine
        with backend.stream("The capital of France is", SamplingConfig(temperature=0, max_tokens=8), chat=False) as gen:
            text = "".join(e.text for e in gen)
        stats = gen.stats
    assert stats is not None and stats.generated_tokens > 0
    features = " ".join(part.strip() for part in system_info().split("|") if "= 1" in part)
    print(
        f"smoke test: decoded {stats.generated_tokens} tokens ({text.strip()[:40]!r}) at {fmt.num(stats.decode_tokens_per_s, 0)} t/s; CPU features: {features}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
