"""What a front end asks to load, in one shape.

The CLI's flags (``commands._common.load_request``), the cockpit's settings,
the library's keywords (``api.load``) and serve's options all become a
``LoadRequest``; ``runtime.plan`` and ``runtime.load`` are the only code that
turns one into a loaded engine. What is None or empty was not given, so the
plan decides it: above all the context, whose default is
``plan.fitting.default_ctx`` alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from localllm.modelfile.lora import read_adapter
from localllm.plan import fitting

if TYPE_CHECKING:
    from localllm.modelfile.lora import AdapterSpec
    from localllm.plan.hardware import Hardware


@dataclass(frozen=True)
class LoadRequest:
    """A model and how to load it.

    ``options.n_ctx`` is the whole cache asked (serve: ``--ctx`` x ``parallel``);
    None lets the plan choose (``fitting.default_ctx``: a conversation's at most
    4096, a server's the trained context per sequence)."""

    model: str | Path | None = None  # a name (catalog, built-in, pulled), a path, or None for the default model
    options: fitting.LoadOptions = field(default_factory=fitting.LoadOptions)  # the load options given (None: the fit chooses)
    vram: int | str | None = None  # a GPU budget instead of the detected one ("4GiB", or bytes)
    hardware: Hardware | None = None  # detected already (the cockpit detects once); None: detected for this load
    rpc: tuple[object, ...] = ()  # llama.cpp RPC workers (``plan.workers.Endpoint``): their devices join this machine's
    lora: tuple[AdapterSpec, ...] = ()  # LoRA adapters: counted by the fit, loaded after the model, by id
    projector: Path | None = None  # a vision model's mmproj: counted against what the fit leaves, loaded after the model
    projector_optional: bool = False  # the cockpit: a projector llama.cpp refuses leaves the model text only (a note, not a failure)
    template: str | None = None  # a chat template (file or name) instead of the model's
    parallel: int = 1  # sequences sharing one unified cache (serve's --parallel)
    serving: bool = False  # serve's batch engine (``engine.batch.BatchModel``), and a server's default context
    n_outputs: int | None = None  # rows of logits one batch may output (speculative drafts, doctor's check of them)
    dry_run: bool = True  # llama.cpp's dry run referees the figures the graph replay does not cover
    cross_check: bool = False  # dry-run where the replay covers the model too (``plan``)

    def fit_request(self) -> fitting.Request:
        """What the fitting service is asked: the options' config with the
        settings given kept, the workers, the adapters' headers (checked against
        the model and counted), the rows of logits."""
        opts = self.options
        if self.rpc and not opts.rpc_servers:
            opts = replace(opts, rpc_servers=tuple(str(ep) for ep in self.rpc))
        req = opts.request()
        if self.lora:
            req = replace(req, adapters=tuple(read_adapter(s.path) for s in self.lora))
        if self.n_outputs is not None:
            req = replace(req, config=replace(req.config, n_outputs_max=self.n_outputs))
        return req
