"""LoRA adapter GGUFs, read and checked against their base model before llama.cpp sees them.

llama.cpp's loader (src/llama-adapter.cpp, ``llama_adapter_lora_init_impl``)
refuses a wrong adapter with lines that do not say what is wrong with it: an
adapter for another architecture is "model arch and LoRA arch mismatch", one
for another embedding size "tensor ... has incorrect shape (hint: maybe wrong
base model?)". So localllm reads both headers itself (pure Python, with
``gguf_file.read_header``) and names both sides in one line. The rules are
llama.cpp's, in its order:

- ``general.type`` must be ``adapter`` and ``adapter.type`` ``lora``;
- ``general.architecture`` must be the model's;
- every tensor ends in ``.lora_a`` or ``.lora_b`` (``*_norm.weight`` is
  skipped), and each base tensor has both;
- the base tensor exists in the model, with ``a.ne[0] == base.ne[0]``,
  ``b.ne[1] == base.ne[1]`` and ``a.ne[1] == b.ne[0]`` (the rank); for
  ``token_embd`` the two are flipped (``llm_build_inp_embd``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from localllm.errors import InputError, UsageError
from localllm.modelfile.gguf_file import GGUFHeader, TensorInfo, read_header


@dataclass(frozen=True)
class AdapterSpec:
    """An adapter to load and the scale it starts with (``--lora``: 1.0;
    ``--lora-scaled FNAME:SCALE``; ``--lora-init-without-apply``: 0.0)."""

    path: Path
    scale: float = 1.0


@dataclass(frozen=True)
class AdapterInfo:
    """A LoRA adapter's header: its architecture, alpha, and (a, b) tensor pairs by base tensor name."""

    path: Path
    architecture: str
    alpha: float
    pairs: dict[str, tuple[TensorInfo, TensorInfo]] = field(default_factory=dict)
    task_name: str = ""
    prompt_prefix: str = ""

    @property
    def n_bytes(self) -> int:
        """The bytes llama.cpp allocates for the adapter: every a and b tensor, at the file's types."""
        return sum(a.n_bytes + b.n_bytes for a, b in self.pairs.values())

    def bytes_by_base(self) -> dict[str, int]:
        """Bytes per base tensor name: llama.cpp puts each pair on the buffer of the tensor it modifies."""
        return {name: a.n_bytes + b.n_bytes for name, (a, b) in self.pairs.items()}


def read_adapter(path: str | Path) -> AdapterInfo:
    """The adapter at ``path``, or one ``InputError`` naming the file and what is
    wrong: missing, not a GGUF, damaged (``read_header``'s checks), a model
    rather than an adapter, not a LoRA, a tensor llama.cpp would refuse."""
    p = Path(path)
    try:
        header = read_header(p)
    except InputError as exc:
        msg = str(exc).replace("model file not found", "LoRA adapter not found")
        raise InputError(msg) from None
    kind = header.get("general.type")
    if kind != "adapter":
        raise InputError(f"{p} is not a LoRA adapter: its general.type is {kind!r}, not 'adapter'"
                         + (" (it is a model: give it as the model, not --lora)" if kind in (None, "model") else ""))
    if header.get("adapter.type") != "lora":
        raise InputError(f"{p} is not a LoRA adapter: its adapter.type is {header.get('adapter.type')!r}, not 'lora'")
    alpha = header.get("adapter.lora.alpha", 0.0)
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool):
        raise InputError(f"{p}: adapter.lora.alpha is not a number; the adapter is damaged")
    pairs: dict[str, list[TensorInfo | None]] = {}
    for t in header.tensors:
        if t.name.endswith(".lora_a") or t.name.endswith(".lora_b"):
            slot = pairs.setdefault(t.name[:-7], [None, None])
            slot[0 if t.name.endswith(".lora_a") else 1] = t
        elif not t.name.endswith("_norm.weight"):  # llama.cpp skips norm vectors
            raise InputError(f"{p}: tensor {t.name[:80]!r} is neither a .lora_a nor a .lora_b; the adapter is damaged")
    done: dict[str, tuple[TensorInfo, TensorInfo]] = {}
    for name, (a, b) in pairs.items():
        if a is None or b is None:
            has, lacks = ("lora_a", "lora_b") if a is not None else ("lora_b", "lora_a")
            raise InputError(f"{p}: {name[:80]!r} has a {has} but no {lacks}; the adapter is damaged")
        if len(a.shape) != 2 or len(b.shape) != 2:
            raise InputError(f"{p}: {name[:80]!r} is not a pair of matrices; the adapter is damaged")
        done[name] = (a, b)
    if not done:
        raise InputError(f"{p}: the adapter has no LoRA tensors")
    return AdapterInfo(path=p, architecture=header.architecture, alpha=float(alpha), pairs=done,
                       task_name=str(header.get("adapter.lora.task_name", "") or ""),
                       prompt_prefix=str(header.get("adapter.lora.prompt_prefix", "") or ""))


def check_adapter(adapter: AdapterInfo, model: GGUFHeader) -> None:
    """Refuse, in one line naming both, an adapter that does not fit ``model``:
    another architecture, another embedding size (read from the tensors: an
    adapter's header has no embedding_length), a tensor the model lacks or of
    another shape. What llama.cpp would refuse anyway, said plainly."""
    p = adapter.path
    if adapter.architecture != model.architecture:
        raise InputError(f"LoRA adapter {p.name} is for architecture {adapter.architecture!r}, "
                         f"but the model {model.path.name} is {model.architecture!r}")
    tensors = {t.name: t for t in model.tensors}
    n_embd = model.arch_key("embedding_length")
    for name, (a, b) in adapter.pairs.items():
        base = tensors.get(name)
        if base is None:
            raise InputError(f"LoRA adapter {p.name} modifies {name[:80]!r}, which the model {model.path.name} does not have "
                             "(an adapter for another base model)")
        if len(base.shape) != 2:
            raise InputError(f"LoRA adapter {p.name} modifies {name[:80]!r}, which is not a matrix in the model {model.path.name}")
        embd = name.endswith("token_embd.weight")
        # GGUF shapes are ne order: ne[0] is the input width (columns)
        want_in, want_out = base.shape[0], base.shape[1]
        got_in, got_out = (b.shape[1], a.shape[1]) if embd else (a.shape[0], b.shape[1])
        if (got_in, got_out) != (want_in, want_out):
            if n_embd is not None and got_in != want_in and want_in == n_embd:
                raise InputError(f"LoRA adapter {p.name} is for an embedding size of {got_in}, "
                                 f"but the model {model.path.name} has {n_embd}")
            if n_embd is not None and got_out != want_out and want_out == n_embd:
                raise InputError(f"LoRA adapter {p.name} is for an embedding size of {got_out}, "
                                 f"but the model {model.path.name} has {n_embd}")
            raise InputError(f"LoRA adapter {p.name}: {name[:80]} is {got_in}x{got_out} in the adapter "
                             f"but {want_in}x{want_out} in the model {model.path.name}")
        if not embd and a.shape[1] != b.shape[0]:
            raise InputError(f"LoRA adapter {p.name}: {name[:80]} has lora_a of rank {a.shape[1]} and lora_b of rank {b.shape[0]}; "
                             "the adapter is damaged (or from llama.cpp's old finetune example)")


def read_checked(path: str | Path, model: GGUFHeader) -> AdapterInfo:
    """``read_adapter`` then ``check_adapter``: what every loader asks first."""
    adapter = read_adapter(path)
    check_adapter(adapter, model)
    return adapter


def parse_scaled(text: str) -> list[tuple[str, float]]:
    """llama-server's ``--lora-scaled FNAME:SCALE[,FNAME:SCALE...]`` (common/arg.cpp:
    split on commas, then each on ':' into exactly two parts). Raises ``ValueError``
    with the reason."""
    out = []
    for item in (s for s in text.split(",") if s):
        parts = item.split(":")
        if len(parts) != 2 or not parts[0]:
            raise ValueError(f"{item!r} is not FNAME:SCALE")
        try:
            scale = float(parts[1])
        except ValueError:
            raise ValueError(f"{parts[1]!r} in {item!r} is not a number") from None
        if scale != scale or scale in (float("inf"), float("-inf")):
            raise ValueError(f"the scale in {item!r} is not finite")
        out.append((parts[0], scale))
    if not out:
        raise ValueError("no adapter given")
    return out


def specs_from_flags(given: list[tuple[str, float]] | None, init_without_apply: bool) -> list[AdapterSpec]:
    """``--lora``/``--lora-scaled`` as parsed (``(path, scale)`` in the order
    given: an adapter's id is its place), each at scale 0 with
    ``--lora-init-without-apply``, as llama-server's README says. That flag
    alone is a ``UsageError``."""
    if init_without_apply and not given:
        raise UsageError("--lora-init-without-apply needs --lora FNAME or --lora-scaled FNAME:SCALE")
    return [AdapterSpec(Path(path).expanduser(), 0.0 if init_without_apply else scale) for path, scale in given or []]
