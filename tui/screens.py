"""The models screen (settings: ``settings_screen``; saved sessions: ``sessions_screen``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Label, ProgressBar, Select, Static, TabbedContent, TabPane

from localllm import paths
from localllm.engine_api.errors import SettingError
from localllm.modelfile.gguf_file import read_header
from localllm.modelfile.model_info import ModelInfo, describe
from localllm.plan import fitting
from localllm.plan.hardware import Hardware
from localllm.plan.prepare import prepare_load
from localllm.quantize.naming import default_output
from localllm.quantize.pipeline import SOURCE_TYPES, Job, Progress, dry_report, run
from localllm.store import registry
from localllm.tui.catalog import CatalogPane
from localllm.tui.quantize_confirm import QuantizeConfirm, QuantizePlan
from localllm.tui.saved import reason
from localllm.tui.settings import Settings
from localllm.util import fmt


def local_models() -> list[registry.ModelEntry]:
    """Every model on disk the registry names: built-in, pulled, the Hugging Face
    cache, LM Studio, Ollama, added folders, localllm's models directory; and the
    built-in gemma3-270m before its first use, as ``localllm list`` shows it
    (choosing it assembles it, on the engine thread: ``cockpit.loading.ensure_built_in``)."""
    try:
        return [e for e in registry.discover() if e.present or e.source == "embedded"]
    except Exception:  # noqa: BLE001 - an unreadable or malformed registry.json: show the loaded model alone
        return []


COLUMNS = {"size": 10, "quant": 7, "context": 7, "fits": 12, "source": 8}  # the widest value each shows
FIT_LABELS = {fitting.Outcome.FITS_AS_ASKED: "yes", fitting.Outcome.DOES_NOT_FIT: "no"}  # any other outcome: "with changes"


@dataclass(frozen=True)
class ModelRow:
    """One model as the models screen lists it, read off the UI thread."""

    path: Path
    cells: tuple[str, ...]  # model, size, quant, context, fits, source
    info: ModelInfo | None  # None: the header could not be read
    error: str = ""


def read_rows(current: Path, made: list[Path], settings: Settings, hw: Hardware) -> list[ModelRow]:
    """Every model the registry names (the loaded one first, then files made on
    the screen), its header read and judged by the fitting service with the
    cockpit's own settings (the context capped at the model's trained one)."""
    entries = local_models()
    labels = {e.path: (e.name, e.source) for e in reversed(entries)}  # the first name a file has wins
    found = [e.path for e in entries] + made
    paths_ = [current] + [p for i, p in enumerate(found) if p != current and p not in found[:i]]
    rows = []
    for p in paths_:
        name, source = labels.get(p, (p.name, "file"))
        if source == "embedded" and not p.exists():
            # sizes n/a until the file is made: nothing here has measured it
            rows.append(ModelRow(p, (name, "n/a", "n/a", "n/a", "n/a", source), None,
                                 f"{name}: built in, assembled from its PyPI package when first chosen (Enter)\n{p}"))
            continue
        try:
            header = read_header(p)
            info = describe(header)
            request = settings.fit_request(settings.ctx_for(info.context_length))
            try:
                # the one way in (plan.prepare), without llama.cpp's dry run: a list of many
                # models; the load of the one chosen is refereed
                fit = prepare_load(p, request, hw, n_ctx=request.config.n_ctx, dry_run=None, header=header).fit
                verdict = FIT_LABELS.get(fit.outcome, "with changes")
            except SettingError:  # llama.cpp would refuse the settings' cache types for this model
                verdict = "no: cache type"
            cells = (
                name + (" (loaded)" if p == current else ""),
                fmt.size(info.size_bytes),
                info.file_type,
                f"{info.context_length:,}",
                verdict,
                source,
            )
            rows.append(ModelRow(p, cells, info))
        except Exception as exc:  # noqa: BLE001 - one bad file is one row, never the end of the app
            rows.append(ModelRow(p, (name, "?", "?", "?", "unreadable", source), None, f"unreadable: {_one_line(exc)}\n{p}"))
    return rows


LOCAL_TITLE = "Models · Enter: switch · q: quantize the selected model · c: catalog · Esc: back"
CATALOG_TITLE = "Catalog · p or Enter: pull · l: local models · Esc: stop a pull, back"
LOCAL_ONLY = ("switch", "quantize", "catalog")  # the actions each tab offers (``check_action``)
CATALOG_ONLY = ("pull", "local")


class ModelsScreen(Screen[Path | None]):
    """Two tabs. Local: the models here, size, quant, context, whether each fits;
    switch or quantize. Catalog (``tui.catalog``, as LM Studio's discover tab):
    the catalog's models not downloaded, judged for this machine; pull one with a
    progress bar, and it is listed and selected on the Local tab. The headers
    are read in a worker (a slow disk or many models never freeze the screen);
    the rows arrive in a ``Rows`` message."""

    DEFAULT_CSS = """
    ModelsScreen TabbedContent { height: 1fr; }
    ModelsScreen ContentSwitcher { height: 1fr; }
    ModelsScreen TabPane { height: 1fr; padding: 0; }
    ModelsScreen #models { height: 1fr; }
    ModelsScreen #details { height: auto; border: round $primary; padding: 0 1; }
    ModelsScreen Horizontal { height: auto; }
    ModelsScreen #qprogress { margin: 1 1; }
    """
    BINDINGS = [("escape", "back", "Back"), ("enter", "switch", "Switch to this model"), ("q", "quantize", "Quantize"),
                ("c", "catalog", "Catalog"), ("p", "pull", "Pull"), ("l", "local", "Local models")]
    AUTO_FOCUS = "#models"  # not the tabs: the arrow keys move through the models, Enter switches

    class Rows(Message):
        """The worker's list of models, ready to show."""

        def __init__(self, rows: list[ModelRow]) -> None:
            super().__init__()
            self.rows = rows

    def __init__(self, current: Path, hardware: Hardware, settings: Settings) -> None:
        super().__init__()
        self.current = current
        self.hardware = hardware
        self.settings = settings
        self.models: list[Path] = []
        self.rows: list[ModelRow] = []
        self.made: list[Path] = []  # files quantized from this screen, listed even outside the models directory
        self.select_after: Path | None = None  # a model just pulled: selected when the rows that list it arrive

    def compose(self) -> ComposeResult:
        yield Label(LOCAL_TITLE, id="title")
        with TabbedContent(id="tabs", initial="local"):
            with TabPane("Local", id="local"):
                yield DataTable(cursor_type="row", id="models")
                yield Static("reading model headers …", id="details")
                with Horizontal():
                    yield Select([(t, t) for t in ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "IQ4_NL")], value="Q4_K_M", allow_blank=False,
                                 id="qtype")
                    yield ProgressBar(total=100, id="qprogress", show_eta=False)
            with TabPane("Catalog", id="catalog-tab"):
                yield CatalogPane(self.hardware, self.settings, id="catalog-pane")
        yield Footer()

    def on_mount(self) -> None:
        # Fixed widths, the model's name taking what is left and wrapping (rows
        # grow): at 80 columns no cell is cut and nothing scrolls sideways.
        table = self.query_one("#models", DataTable)
        fixed = sum(COLUMNS.values()) + 2 * (len(COLUMNS) + 1) + 2  # cell padding, the scrollbar
        table.add_column("model", width=max(16, self.app.size.width - fixed))
        for label, width in COLUMNS.items():
            table.add_column(label, width=width)
        self.refresh_models()

    def refresh_models(self) -> None:
        """Read the models again (in a worker); the table updates when they arrive."""
        self._read_models(list(self.made))

    @work(thread=True, exclusive=True, group="models", exit_on_error=False)
    def _read_models(self, made: list[Path]) -> None:
        self.post_message(self.Rows(read_rows(self.current, made, self.settings, self.hardware)))

    @on(Rows)
    def _show_rows(self, msg: Rows) -> None:
        table = self.query_one("#models", DataTable)
        first = not self.rows  # later lists (after a quantize) keep the details line's news
        table.clear()
        self.rows = msg.rows
        self.models = [r.path for r in msg.rows]
        for r in msg.rows:
            table.add_row(*r.cells, height=None)
        if first and msg.rows:
            self._show_details(msg.rows[0])
        pulled = self.select_after
        if pulled is not None:
            real = [_real(p) for p in self.models]
            if _real(pulled) in real:
                self.select_after = None
                table.move_cursor(row=real.index(_real(pulled)))
                self._show_details(msg.rows[real.index(_real(pulled))])

    @on(DataTable.RowHighlighted, "#models")
    def _details(self, event: DataTable.RowHighlighted) -> None:
        if 0 <= event.cursor_row < len(self.rows):
            self._show_details(self.rows[event.cursor_row])

    def _show_details(self, row: ModelRow) -> None:
        i = row.info
        if i is None:
            self.query_one("#details", Static).update(row.error)
            return
        self.query_one("#details", Static).update(
            f"{i.name} · {i.architecture} · {fmt.count(i.n_params)} params · {i.bits_per_weight:.2f} bpw\n"
            f"{i.n_layer} layers · heads {i.n_head}/{i.n_head_kv} · head dim {i.head_dim_k} · vocab {i.n_vocab:,}"
            + (f" · sliding window {i.sliding_window} on {len(i.swa_layers)} layers" if i.sliding_window else "")
            + f"\n{row.path}"
        )

    @on(DataTable.RowSelected, "#models")
    def _row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(self.models[event.cursor_row])

    def _selected(self) -> Path | None:
        table = self.query_one("#models", DataTable)
        return self.models[table.cursor_row] if self.models else None

    def action_switch(self) -> None:
        self.dismiss(self._selected())

    def action_back(self) -> None:
        """Esc: stop a running pull first (its partial file kept); else leave."""
        if not self.query_one(CatalogPane).cancel():
            self.dismiss(None)

    # -- the tabs ------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Each tab's keys only, in the footer and in effect."""
        tabs = self.query(TabbedContent)  # none yet while the screen is being composed
        on_catalog = bool(tabs) and tabs.first().active == "catalog-tab"
        if action in LOCAL_ONLY:
            return not on_catalog
        if action in CATALOG_ONLY:
            return on_catalog
        return True

    def action_catalog(self) -> None:
        self.query_one(TabbedContent).active = "catalog-tab"

    def action_local(self) -> None:
        self.query_one(TabbedContent).active = "local"

    def action_pull(self) -> None:
        self.query_one(CatalogPane).pull_selected()

    @on(TabbedContent.TabActivated)
    def _tab_shown(self, event: TabbedContent.TabActivated) -> None:
        """The tab's title and keys; its table takes the keys; the catalog is
        read when first shown (opening F2 costs what it did)."""
        on_catalog = event.pane.id == "catalog-tab"
        self.query_one("#title", Label).update(CATALOG_TITLE if on_catalog else LOCAL_TITLE)
        self.query_one("#catalog" if on_catalog else "#models", DataTable).focus()
        if on_catalog:
            self.query_one(CatalogPane).load()
        self.refresh_bindings()

    @on(CatalogPane.Pulled)
    def _pulled(self, msg: CatalogPane.Pulled) -> None:
        """A model pulled: read the local list again and select it there (Enter switches to it)."""
        self.select_after = msg.path
        self.refresh_models()
        self.action_local()

    class Ask(Message):
        """A quantize worked out (``QuantizePlan``): ask before doing it."""

        def __init__(self, plan: QuantizePlan) -> None:
            super().__init__()
            self.plan = plan

    def action_quantize(self) -> None:
        src = self._selected()
        if src is not None:
            self.query_one("#details", Static).update(f"working out what quantizing {src.name} would write …")
            self._plan_quantize(src, str(self.query_one("#qtype", Select).value))

    @work(thread=True, exclusive=True, group="quantize", exit_on_error=False)
    def _plan_quantize(self, src: Path, qtype: str) -> None:
        """The output (in localllm's own models folder, as ``quantize NAME``
        writes: ``localllm list`` shows it), its predicted size and whether the
        source is quantized already."""
        dst = paths.ensure_dir(paths.models_dir()) / default_output(src, qtype).name
        try:
            source_type = describe(read_header(src)).file_type
            requantize = source_type not in SOURCE_TYPES
            problem = f"{dst.name} exists already: remove it first (localllm rm), or pick another type" if dst.exists() else ""
            predicted = None if problem else dry_report(Job(src, dst, qtype, allow_requantize=True)).output_bytes
        except Exception as exc:  # noqa: BLE001 - shown where the user looks; the app goes on
            self.app.call_from_thread(self.query_one("#details", Static).update, f"cannot quantize {src.name}: {_one_line(exc)}")
            return
        self.post_message(self.Ask(QuantizePlan(src, dst, qtype, source_type, predicted, requantize, problem)))

    @on(Ask)
    def _ask(self, msg: Ask) -> None:
        plan = msg.plan

        def answered(allow_requantize: bool | None) -> None:
            if allow_requantize is None:
                self.query_one("#details", Static).update("quantize cancelled")
                return
            self._quantize(plan.src, plan.dst, plan.qtype, allow_requantize)

        self.app.push_screen(QuantizeConfirm(plan), answered)

    @work(thread=True, exclusive=True, group="quantize", exit_on_error=False)
    def _quantize(self, src: Path, dst: Path, qtype: str, allow_requantize: bool) -> None:
        bar = self.query_one("#qprogress", ProgressBar)
        details = self.query_one("#details", Static)
        self.app.call_from_thread(details.update, f"quantizing {src.name} to {qtype} → {dst}")
        try:
            for event in run(Job(src, dst, qtype, allow_requantize=allow_requantize)):
                if isinstance(event, Progress):
                    self.app.call_from_thread(bar.update, total=event.total, progress=event.index)
                else:
                    self.app.call_from_thread(
                        details.update, f"wrote {dst.name}: {fmt.size(event.output_bytes)}, {event.bits_per_weight:.2f} bpw in {event.seconds:.1f} s"
                    )
        except Exception as exc:  # noqa: BLE001 - shown where the user looks; the app goes on
            self.app.call_from_thread(details.update, f"quantize failed: {_one_line(exc)}")
            return
        self.made.append(dst)
        self.post_message(self.Rows(read_rows(self.current, list(self.made), self.settings, self.hardware)))


def _real(path: Path) -> Path:
    """``path`` with its links resolved (a pulled model is a snapshot link to a blob); itself if that fails."""
    try:
        return path.resolve()
    except OSError:
        return path


def _one_line(exc: BaseException) -> str:

    return reason(exc)
