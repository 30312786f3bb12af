"""The cockpit's conversation on disk: saved after each message and reply, and
its KV cache kept as it is left (a conversation reopens without being read
again, nor its images encoded again; ``chat.resume``).

A save is two fsyncs, which a slow disk can hold for longer than a frame: saves
run on one disk thread (``Saver``), in the order they were made. A failed one
(disk full, a read-only folder) is one event, and the chat goes on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from localllm.audio.sound import AudioClip
from localllm.chat import resume, sessions
from localllm.chat.session import ChatSession
from localllm.cockpit.events import Resumed, SaveState
from localllm.cockpit.settings import Settings
from localllm.cockpit.wording import reason
from localllm.errors import LocalLLMError
from localllm.vision.image import RGBImage
from localllm.vision.marker import with_images


class Saver:
    """Sessions written in order on a disk thread of their own, off the UI thread."""

    def __init__(self, emit: Callable[[object], None]) -> None:
        self.emit = emit  # told (SaveState) only when saving starts failing or works again
        self._disk = ThreadPoolExecutor(max_workers=1, thread_name_prefix="save")
        self._error: str | None = None  # the last save's failure (read and set on the disk thread)

    def save(self, saved: sessions.SavedSession) -> None:
        """Write a copy of the session on the disk thread (the session may change meanwhile)."""
        snapshot = dataclasses.replace(saved, messages=list(saved.messages), settings=dict(saved.settings or {}), images=list(saved.images))
        self._disk.submit(self._write, snapshot)

    def wait(self) -> None:
        """Block until the saves queued so far are on disk (call it off the UI
        thread): a reader of the session files must not see an older chat."""
        self._disk.submit(lambda: None).result()

    def shutdown(self) -> None:
        """The last saves reach the disk, then the thread ends."""
        self._disk.shutdown(wait=True)

    def _write(self, snapshot: sessions.SavedSession) -> None:
        """Save; tell only when saving starts failing or works again (one line
        for a full disk, not one per message)."""
        try:
            sessions.save(snapshot)
            error = None
        except (OSError, LocalLLMError) as exc:
            error = reason(exc)
        if error != self._error:
            self._error = error
            self.emit(SaveState(error))


def updated(saved: sessions.SavedSession | None, chat: ChatSession, model: str, settings: Settings, refs: Callable[[list[RGBImage | AudioClip]], Any],
            extra_user: dict[str, str] | None = None, images: Sequence[RGBImage | AudioClip] = ()) -> sessions.SavedSession:
    """``saved`` (a new session if None) holding the chat: with the user's message
    (``extra_user``, with ``images``) not sent yet, if given. Images are kept as
    their paths and the sha256 of their pixels (``refs``), never as pixels."""
    if saved is None:
        saved = sessions.SavedSession.new(model, settings.system_prompt, settings.to_dict())
    msgs = list(chat.messages)
    pictures = list(chat.images)
    if extra_user is not None:
        content = with_images(extra_user["content"], len(images)) if images or pictures else extra_user["content"]
        msgs.append({**extra_user, "content": content})
        pictures += images
    saved.messages = msgs
    saved.images = refs(pictures)
    saved.kv = None  # the conversation moved on from a kept cache (its file is written over at the next leave)
    saved.settings = settings.to_dict()
    return saved


def keep_kv(chat: ChatSession, saved: sessions.SavedSession) -> bool:
    """Engine thread: keep a conversation's KV cache beside its saved session
    within the disk budget (``sessions.keep_kv``), so reopening it reads nothing
    again; True when kept (``saved.kv`` then marks it). A failed write, or a bad
    budget in the config file, only loses that saving."""
    try:
        return sessions.keep_kv(chat, saved)
    except (OSError, LocalLLMError):
        return False


def resume_kv(chat: ChatSession, saved: sessions.SavedSession) -> Resumed:
    """Engine thread: a reopened conversation's kept KV cache, loaded when it stands for the conversation."""
    assert saved.kv is not None
    try:
        why = resume.resume(chat, sessions.state_path(saved.id), saved.kv)
    except (OSError, LocalLLMError) as exc:
        why = reason(exc)
    return Resumed(why, len(chat.images))
