"""llama-server's spelling on ``localllm serve``: the flags it shares with
llama-server (``--jinja``, ``--metrics``, ``--slots``, ``--cors``; ``-m``,
``-c``, ``-np``, ``-t``, ``--temp``, ``--seed``, ``-n``... are the ordinary
options' aliases), and the llama-server flags it cannot honour, each refused
by name with the reason rather than ignored or reported as unknown."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

from localllm import flags

DEFAULT_PARALLEL = 4  # serve's --parallel, as llama-server's -np auto (tools/server/server.cpp: "using n_parallel = 4")

# llama-server's flags that serve does not do, and why (a usage error naming the flag)
UNSUPPORTED = {
    ("--control-vector", "--control-vector-scaled", "--control-vector-layer-range"): "control vectors are not supported",
    ("--mmproj-url", "-mmu"): "this tool is offline: give the projector's file with --mmproj FILE (localllm pull fetches it beside the model)",
    ("-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-mu", "--model-url"): "give a model name or a .gguf path (localllm pulls Hub models itself)",
    ("-md", "--model-draft", "-hfd", "--hf-repo-draft", "--draft", "--draft-max", "--draft-min"): "speculative decoding is not supported in serve",
    ("--rope-scaling", "--rope-scale", "--rope-freq-base", "--rope-freq-scale", "--yarn-orig-ctx", "--yarn-ext-factor",
     "--yarn-attn-factor", "--yarn-beta-slow", "--yarn-beta-fast", "-gan", "--grp-attn-n", "-gaw", "--grp-attn-w"):
        "RoPE and context-extension overrides are not supported: the model's own settings are used",
    ("--override-kv", "--override-tensor", "-ot"): "overriding the model's metadata or tensor placement is not supported",
    ("-nkvo", "--no-kv-offload", "--mlock", "--no-mmap", "--numa", "-sm", "--split-mode", "-ts", "--tensor-split", "-mg",
     "--main-gpu", "-dev", "--device"): "placement is planned by localllm (see --vram, --ngl, --rpc)",
    ("--props",): "changing the server's properties over HTTP is not supported",
    ("--path", "--webui", "--no-webui", "--api-prefix"): "serve has no web UI and no static files",
    ("--api-key-file",): "give --api-key, or LOCALLLM_API_KEY",
    ("--ssl-key-file", "--ssl-cert-file"): "serve has no TLS: put a reverse proxy in front",
    ("--threads-http",): "not configurable in serve",
    ("--cache-reuse", "--no-cache-prompt", "--ctx-checkpoints", "--swa-checkpoints"): "prefix reuse is automatic (see docs/serve.md)",
    ("--no-cont-batching", "-nocb"): "serve always batches continuously",
    ("--no-context-shift", "--context-shift", "--keep", "-k"): "serve does not shift the context: a request gets up to --ctx tokens",
    ("--no-jinja",): "chat templates are always rendered with Jinja (or a llama.cpp built-in given by --chat-template)",
    ("-sp", "--special", "--no-warmup", "--system-prompt-file"): "not supported in serve",
    ("--log-file", "--log-format", "--log-disable", "--log-colors", "--log-verbosity", "-lv"): "serve logs one line per request to stderr (--json for JSON)",
    ("--n-probs", "--defrag-thold", "-dt", "-cd", "--ctx-size-draft", "-np-draft"): "not supported in serve",
    ("--models-dir",): "serve with no MODEL serves the models of localllm list (localllm add DIR names a folder of GGUFs)",
}



def _folder(text: str) -> Path:
    """An existing folder, resolved: slot files are only ever written inside it."""
    p = Path(text).expanduser()
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder: create it first (mkdir -p {text})")
    return p.resolve()

def refused() -> frozenset[str]:
    """Every llama-server flag serve refuses (a presets INI may not set them either)."""
    return frozenset(flag for flags in UNSUPPORTED for flag in flags)


class _Refuse(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object, option: str | None = None) -> NoReturn:
        why = next(w for flags, w in UNSUPPORTED.items() if option in flags)
        parser.error(f"serve does not support llama-server's {option}: {why}")


def add(p: argparse.ArgumentParser) -> None:
    """serve's llama-server flags (the shared ones and the refused ones)."""
    g = p.add_argument_group("llama-server's flags")
    g.add_argument("--jinja", action="store_true", help="accepted: chat templates are always Jinja here (llama-server's --jinja)")
    g.add_argument("--metrics", action="store_true", help="serve GET /metrics (Prometheus text); without it /metrics answers 501, as llama-server")
    g.add_argument("--slots", action="store_true", help="serve GET /slots (what each slot is doing); without it /slots answers 501")
    g.add_argument("--no-slots", dest="slots", action="store_false", help="no /slots (the default)")
    g.add_argument("--spm-infill", action="store_true",
                   help="/infill puts the suffix before the prefix (suffix-prefix-middle), for the models trained so (llama-server's)")
    g.add_argument("--reasoning-format", choices=("auto", "deepseek", "deepseek-legacy", "none"), default="auto",
                   help="a thinking model's thinking: apart, in reasoning_content, Messages' thinking blocks and Responses' reasoning items "
                        "(auto, deepseek), also left in the text (deepseek-legacy), or left in the text only (none) (llama-server's flag)")
    flags.add_reasoning(g)
    g.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help="more variables for the chat template, as a JSON object (e.g. '{\"reasoning_effort\": \"low\"}'); "
                        "a request's chat_template_kwargs are set over them (llama-server's flag)")
    g.add_argument("--mcp-servers-config", default=None, metavar="FILE",
                   help="serve these MCP servers' tools on GET/POST /tools ({\"mcpServers\": {NAME: {command, args, env}}}, llama-server's); "
                        "a chat completion never runs a tool itself")
    g.add_argument("--mcp-servers-json", default=None, metavar="JSON", help="the same, given as JSON text")
    g.add_argument("--tools", default=None, metavar="NAME[,NAME]|all",
                   help="serve llama-server's built-in tools on GET/POST /tools: read_file, file_glob_search, grep_search, "
                        "exec_shell_command, write_file, edit_file, get_info, or all (experimental, off by default: they read, "
                        "write and run what this user may, for whoever can reach the API; CORS then allows pages of this machine "
                        "only, unless --cors says otherwise; llama-server's flag)")
    g.add_argument("--ui-mcp-proxy", action="store_true",
                   help="serve /cors-proxy?url=URL, which forwards a web page's request to URL with only the headers it names "
                        "(x-llama-server-proxy-header-NAME); experimental, off by default: it reaches whatever this machine "
                        "reaches (llama-server's flag, for its web UI's MCP client)")
    g.add_argument("--media-path", default=None, metavar="DIR", type=_folder,
                   help="read file:// pictures of requests under DIR (named relative to it, no '..'); without it file:// URLs "
                        "are a 400 (llama-server's flag)")
    g.add_argument("--tags", default=None, metavar="TAG[,TAG]", help="labels listed with the model on /v1/models (llama-server's flag)")
    g.add_argument("--verbose", dest="verbose_replies", action="store_true",
                   help="every reply carries llama-server's __verbose field (its /completion fields and the prompt as templated) "
                        "unless its request says \"verbose\": false (llama-server's flag; localllm -v shows llama.cpp's log)")
    g.add_argument("--slot-save-path", default=None, metavar="DIR", type=_folder,
                   help="POST /slots/{id}?action=save|restore|erase write and read a slot's cached prompt as a file in DIR "
                        "(llama-server's flag; without it they answer 501)")
    g.add_argument("--cors", action="append", default=None, metavar="ORIGIN",
                   help="let web pages from ORIGIN call the API (repeatable; * for any; localhost for any page of this machine, any port); "
                        "without it: any origin when --api-key is set (as llama-server), this machine's pages with --tools, "
                        "else no CORS headers at all")
    g.add_argument("--cors-origins", dest="cors", action="append", metavar="ORIGIN[,ORIGIN]",
                   help="llama-server's name for --cors, comma-separated")
    for names in UNSUPPORTED:
        g.add_argument(*names, action=_Refuse, nargs="?", help=argparse.SUPPRESS)
