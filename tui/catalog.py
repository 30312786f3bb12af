"""The models screen's catalog tab (issue 46, as LM Studio's discover tab): the
catalog's models not downloaded yet, each with its size and the plan's verdict
for this machine, and a pull with a progress bar that Esc stops.

What is listed, judged and pulled is ``localllm.store.offers``'s (no Textual
there); this pane only shows it. The catalog is read and judged in a worker (38
verdicts take seconds on a slow laptop: the names come first, each verdict as it
is made), and the pull runs in a worker thread through the same pull as
``localllm pull`` (resume, sha256, the Hub's answers untrusted). A stopped pull
keeps its partial file, as Ctrl+C does, and the next ``p`` resumes it. Every
failure is one line under the bar, never a traceback.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import DataTable, ProgressBar, Static
from textual.worker import get_current_worker

from localllm.engine_api.errors import SettingError
from localllm.plan.hardware import Hardware
from localllm.store import offers
from localllm.tui.saved import reason
from localllm.tui.settings import Settings
from localllm.util import fmt

SIZE_WIDTH = 11  # "≈131.41 GiB"
NAME_WIDTH = (16, 36)  # the model's name: at least, at most; the verdict takes the rest (at least FITS_WIDTH)
FITS_WIDTH = 30
PENDING = "judging …"
PROGRESS_EVERY = 0.1  # seconds between the worker's progress messages: a fast link must not flood the UI
JUDGED_EVERY = 0.3  # seconds between batches of verdicts: each batch lays the table out again


class CatalogPane(Vertical):
    """The catalog's models not downloaded here; ``pull`` fetches the selected one."""

    DEFAULT_CSS = """
    CatalogPane { height: 1fr; }
    CatalogPane DataTable { height: 1fr; }
    CatalogPane #catalog-details { height: auto; border: round $primary; padding: 0 1; }
    CatalogPane #pull-progress { margin: 0 1; display: none; }
    CatalogPane #pull-status { height: auto; padding: 0 1; }
    """

    class Listed(Message):
        """The catalog's files not downloaded, in order; their verdicts follow."""

        def __init__(self, found: list[offers.Offer]) -> None:
            super().__init__()
            self.found = found

    class Judged(Message):
        """Verdicts for this machine, in words, by offer name (a batch of them)."""

        def __init__(self, verdicts: dict[str, str]) -> None:
            super().__init__()
            self.verdicts = verdicts

    class Failed(Message):
        """The catalog could not be read: one line."""

        def __init__(self, line: str) -> None:
            super().__init__()
            self.line = line

    class Progress(Message):
        """Bytes of the running pull: done of total."""

        def __init__(self, name: str, done: int, total: int) -> None:
            super().__init__()
            self.name = name
            self.done = done
            self.total = total

    class Ended(Message):
        """The pull ended: ``path`` the stored file, or None with the line saying why not."""

        def __init__(self, name: str, path: Path | None, line: str) -> None:
            super().__init__()
            self.name = name
            self.path = path
            self.line = line

    class Pulled(Message):
        """For the screen: a model is stored now; list it and select it."""

        def __init__(self, path: Path) -> None:
            super().__init__()
            self.path = path

    def __init__(self, hardware: Hardware, settings: Settings, *, id: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id)
        self.hardware = hardware
        self.settings = settings
        self.offers: list[offers.Offer] = []
        self.verdicts: dict[str, str] = {}  # offer name -> the verdict's words, as they arrive
        self.loaded = False  # read once, when the tab is first shown: F2 itself stays as quick as before
        self.pulling: str | None = None  # the name being pulled; one pull at a time
        self._stop = threading.Event()

    def compose(self) -> ComposeResult:
        yield DataTable(cursor_type="row", id="catalog")
        yield Static("reading the catalog …", id="catalog-details", markup=False)
        yield ProgressBar(total=None, id="pull-progress", show_eta=False)
        yield Static("p or Enter: pull the selected model", id="pull-status", markup=False)

    def on_mount(self) -> None:
        # Widths that fit the terminal, long names and verdicts wrapping (rows grow), as on the
        # local tab: at 80 columns nothing is cut and nothing scrolls sideways; wider, the verdict gets the room.
        table = self.query_one(DataTable)
        room = self.app.size.width - SIZE_WIDTH - 2 * 3 - 2  # cell padding, the scrollbar
        name = max(NAME_WIDTH[0], min(NAME_WIDTH[1], room - FITS_WIDTH))
        table.add_column("model", width=name, key="model")
        table.add_column("size", width=SIZE_WIDTH, key="size")
        table.add_column(f"fits here ({offers.ESTIMATE})", width=max(FITS_WIDTH, room - name), key="fits")

    # -- the list ------------------------------------------------------------------

    def load(self) -> None:
        """Read the catalog and judge it (once; a pull removes its row itself)."""
        if not self.loaded:
            self.loaded = True
            self._read()

    @work(thread=True, exclusive=True, group="catalog", exit_on_error=False)
    def _read(self) -> None:
        try:
            found = offers.offers()
        except Exception as exc:  # noqa: BLE001 - a broken catalog or registry is one line
            self.post_message(self.Failed(f"cannot read the catalog: {reason(exc)}"))
            return
        self.post_message(self.Listed(found))
        worker = get_current_worker()
        batch: dict[str, str] = {}
        last = time.monotonic()
        for offer in found:
            if worker.is_cancelled:
                return
            batch[offer.name] = self._judge(offer)
            if time.monotonic() - last >= JUDGED_EVERY:
                self.post_message(self.Judged(batch))
                batch, last = {}, time.monotonic()
        if batch:
            self.post_message(self.Judged(batch))

    def _judge(self, offer: offers.Offer) -> str:
        """The verdict's words at the cockpit's settings (its context capped at the
        model's trained one), as the local tab's "fits" column asks."""
        request = self.settings.fit_request(self.settings.ctx_for(offer.model.context))
        try:
            return offers.judge(offer, self.hardware, request).text
        except SettingError:  # llama.cpp would refuse the settings' cache types for this model
            return "no: cache type"
        except Exception as exc:  # noqa: BLE001 - one entry the planner cannot judge is one cell
            return f"not judged: {reason(exc)}"

    @on(Listed)
    def _listed(self, msg: Listed) -> None:
        self.offers = msg.found
        self._fill()
        if not msg.found:
            self._details().update("every model of the catalog is downloaded: the Local tab lists them")

    @on(Judged)
    def _judged(self, msg: Judged) -> None:
        self.verdicts.update(msg.verdicts)
        self._fill()

    def _fill(self) -> None:
        """The rows again, the cursor kept: a row's height is measured when it is
        added, and a verdict may need more lines than "judging …" did."""
        table = self.query_one(DataTable)
        row = table.cursor_row
        table.clear()
        for o in self.offers:
            table.add_row(Text(o.name), Text(f"≈{fmt.size(o.size_bytes)}"), Text(self.verdicts.get(o.name, PENDING)), key=o.name, height=None)
        if self.offers:
            table.move_cursor(row=min(max(row, 0), len(self.offers) - 1))
            self._show_details(self.offers[table.cursor_row])

    @on(Failed)
    def _failed(self, msg: Failed) -> None:
        self._details().update(msg.line)

    @on(DataTable.RowHighlighted, "#catalog")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        if 0 <= event.cursor_row < len(self.offers):
            self._show_details(self.offers[event.cursor_row])

    @on(DataTable.RowSelected, "#catalog")
    def _chosen(self, event: DataTable.RowSelected) -> None:
        event.stop()
        self.pull_selected()

    def selected(self) -> offers.Offer | None:
        row = self.query_one(DataTable).cursor_row
        return self.offers[row] if 0 <= row < len(self.offers) else None

    def _details(self) -> Static:
        return self.query_one("#catalog-details", Static)

    def _show_details(self, o: offers.Offer) -> None:
        m, f = o.model, o.file
        budget = self.hardware.gpu_budget
        where = f"a {fmt.size(budget)} GPU" if budget else "this RAM (no GPU budget)"
        said = self.verdicts.get(o.name, PENDING)
        self._details().update(
            f"{m.name} {f.quant} · ≈{fmt.size(o.size_bytes)} · {m.architecture} · {m.license} · trained context {m.context:,}\n"
            f"fits {where}, at the cockpit's settings: {said}\n"
            f"size and fit are {offers.ESTIMATE}s (the listing, the published shape) until pulled"
        )

    # -- the pull ------------------------------------------------------------------

    def pull_selected(self) -> None:
        """Pull the highlighted model in a worker (one pull at a time)."""
        chosen = self.selected()
        status = self.query_one("#pull-status", Static)
        if self.pulling is not None:
            status.update(f"pulling {self.pulling} already: Esc stops it")
            return
        if chosen is None:
            return
        self.pulling = chosen.name
        self._stop.clear()
        bar = self.query_one(ProgressBar)
        bar.update(total=None, progress=0)
        bar.display = True
        status.update(f"pulling {chosen.name}: asking the Hub · Esc stops it")
        self._pull(chosen.name)

    def cancel(self) -> bool:
        """Stop the running pull (after the chunk in flight); False when there is
        none, or it is stopping already (the second Esc leaves the screen)."""
        if self.pulling is None or self._stop.is_set():
            return False
        self._stop.set()
        self.query_one("#pull-status", Static).update(f"stopping the pull of {self.pulling} …")
        return True

    @work(thread=True, exclusive=True, group="pull", exit_on_error=False)
    def _pull(self, name: str) -> None:
        worker = get_current_worker()
        last = 0.0

        def on_bytes(done: int, total: int) -> None:
            nonlocal last
            now = time.monotonic()
            if done >= total or now - last >= PROGRESS_EVERY:
                last = now
                self.post_message(self.Progress(name, done, total))

        def should_stop() -> bool:
            return self._stop.is_set() or worker.is_cancelled  # Esc, or the screen closed

        try:
            result = offers.pull(name, on_bytes=on_bytes, should_stop=should_stop)
        except offers.Stopped as exc:
            kept = f"{fmt.size(exc.done)} of {fmt.size(exc.total)} kept" if exc.total else "nothing downloaded yet"
            self.post_message(self.Ended(name, None, f"pull of {name} stopped: {kept}; p pulls it again, resuming"))
            return
        except Exception as exc:  # noqa: BLE001 - hub unreachable, 404, disk full, bad checksum: one line, the app goes on
            self.post_message(self.Ended(name, None, f"pull of {name} failed: {reason(exc)}"))
            return
        how = "in the cache already" if result.from_cache else f"{fmt.size(result.downloaded_bytes)} downloaded" + (
            f" (resumed after {fmt.size(result.resumed_from)})" if result.resumed_from else "") + ", sha256 verified"
        self.post_message(self.Ended(name, Path(result.path), f"pulled {name} as {result.name}: {how}"))

    @on(Progress)
    def _progress(self, msg: Progress) -> None:
        if msg.name != self.pulling or self._stop.is_set():
            return
        self.query_one(ProgressBar).update(total=max(msg.total, 1), progress=msg.done)
        self.query_one("#pull-status", Static).update(f"pulling {msg.name}: {fmt.size(msg.done)} of {fmt.size(msg.total)} · Esc stops it")

    @on(Ended)
    def _ended(self, msg: Ended) -> None:
        self.pulling = None
        self._stop.clear()
        self.query_one(ProgressBar).display = msg.path is not None  # full after a pull; gone after a failure
        self.query_one("#pull-status", Static).update(msg.line)
        if msg.path is None:
            return
        names = [o.name for o in self.offers]
        if msg.name in names:
            self.offers.pop(names.index(msg.name))
            self._fill()
        self.post_message(self.Pulled(msg.path))
