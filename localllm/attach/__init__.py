"""Files as context: a text file or a PDF read, bounded and labelled for a prompt.

``run --file``, ``chat``'s ``/file`` and (later) the cockpit attach a file the
same way: ``read(path)`` checks what the path is before opening it (a FIFO or a
device is never opened), refuses binary, unreadable and encrypted files with one
line naming the file and the cause, bounds bytes, pages and characters (saying
what was kept), and ``message(typed, attachments)`` puts each file's text in a
labelled block that its own text cannot close. Counting its tokens and keeping
control-token text inert is the engine's job (the caller's tokenizer): this
package stays below the engine and imports no model code.
"""

from localllm.attach.block import block, message
from localllm.attach.model import Attachment, Limits
from localllm.attach.reader import read

__all__ = ["Attachment", "Limits", "block", "message", "read"]
