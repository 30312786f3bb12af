"""llama-server's experimental built-in tools (``--tools NAME,NAME`` or ``all``):
``read_file``, ``file_glob_search``, ``grep_search``, ``exec_shell_command``,
``write_file``, ``edit_file`` and ``get_info``, for ``GET``/``POST /tools``,
answering as llama-server's own (tools/server/server-tools.cpp) so that its
web UI and its tests work against ``localllm serve`` unchanged.

They are off unless the server is started with ``--tools``: they read, write
and run anything the server's user may, for whoever can reach the API (behind
the API key as every route). Every value of a call is untrusted: checked,
bounded in size and time, and a bad one gets one line (the answer's ``error``
field, or a 4xx), never a traceback or a hang.

- ``base``: the call's context (the ``x-tool-cwd``/``x-tool-runtime`` headers), errors, parameters;
- ``places``: the host, or an isolate the runtime header names (a container, an ssh host), checked;
- ``proc``: a command run with bounds (time, output, its whole process group);
- ``files``, ``search``, ``shell``: the tools; ``grep_worker``: grep's matching in a process of its own;
- ``toolbox``: the chosen tools, their definitions, and calls on worker threads.

No Starlette here: the HTTP side is ``localllm.serve.mcp_routes``.
"""

from localllm.server_tools.base import BadParams, Context, RuntimeRefused, ToolError, UnknownTool
from localllm.server_tools.toolbox import NAMES, Toolbox, choose

__all__ = ["NAMES", "BadParams", "Context", "RuntimeRefused", "ToolError", "Toolbox", "UnknownTool", "choose"]
