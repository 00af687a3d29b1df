"""The main window: hardware header, runs list, the selected run's tabs, Start/Stop/Resume/Export.

It only binds views to the controllers (Monitor, RunController, HardwareMonitor) and asks the user
questions; the controllers own processes, timers and files.
"""
from __future__ import annotations

import gc
from pathlib import Path

from PySide6 import QtCore, QtGui, QtWidgets

from app.model import advice
from app.model import failed_start, resume_choice
from trainer.rundir.runstate import read_run_state
from app.ops import background, settings
from app.views.export_dialog import ExportDialog
from app.views.export_model_dialog import ExportModelDialog, VerifyExportDialog
from app.views.resume_dialog import ResumeDialog
from app.ops.hardware_feed import HardwareMonitor
from app.views.header import HardwareHeader
from app.views.learning_view import RunEndNotifier
from app.ops.monitor import Monitor
from app.ops.run_controller import RunController
from app.views.run_list import RunList
from app.views.run_view import RunView
from app.ops.stop_waiter import StopWaiter, close_question
from app.views.wizard.wizard import SetupWizard

KEEP, STOP_AND_SAVE, CANCEL = "keep", "stop", "cancel"
RESUME_TIP = "Continue a stopped or crashed run from its last checkpoint"
ICON = Path(__file__).resolve().parents[1] / "resources" / "icons" / "trainpilot.svg"


class MainWindow(QtWidgets.QMainWindow):
    """TrainPilot's window. ``open_wizard()`` starts the setup wizard.

    With ``lazy=True`` (the app) the plots, the run watcher and the probe start right after the
    window is first shown (pyqtgraph and numpy take most of a cold start); ``startup_done`` fires
    then. Tests construct it eagerly."""

    startup_done = QtCore.Signal()

    def __init__(self, hardware_file: str | None = None, parent=None, lazy: bool = False):
        super().__init__(parent)
        self.setWindowTitle("TrainPilot")
        if ICON.exists():
            self.setWindowIcon(QtGui.QIcon(str(ICON)))
        self.hardware_file = hardware_file
        self.hardware = HardwareMonitor(hardware_file, parent=self)
        self.monitor = Monitor(self)
        self.runs = RunController(self)
        self.runs.hardware_file = hardware_file
        self.header = HardwareHeader()
        self.run_list = RunList()
        self.run_view = RunView()
        self._build_actions()
        self._layout()
        self._connect()
        self.wizard = None
        self._wizard_runs: dict[str, tuple] = {}  # run_dir → (wizard, config path) until the run is under way
        self.started = False
        geometry = settings.settings().value("geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        if lazy:  # after the first paint (or 0.5 s, should the window never be exposed)
            self._painted_once = False
            QtCore.QTimer.singleShot(500, self.finish_startup)
        else:
            self.finish_startup()

    # -- construction ---------------------------------------------------------------------------
    def _build_actions(self) -> None:
        bar = self.addToolBar("Run")
        bar.setObjectName("runbar")
        bar.setMovable(False)
        self.act_new = bar.addAction("New run…", self.open_wizard)
        self.act_open = bar.addAction("Open run folder…", self._ask_open_folder)
        self.act_demo = bar.addAction("Demo run", lambda: self.start_demo())
        bar.addSeparator()
        self.act_resume = bar.addAction("Resume", self.resume_selected)
        self.act_stop = bar.addAction("Stop", self.stop_selected)
        self.act_export = bar.addAction("Export…", self.export_selected)
        self.act_export_model = bar.addAction("Export model…", self.export_model_selected)
        self.act_verify_export = bar.addAction("Verify export…", self.verify_export)
        self.act_verify_export.setToolTip("Check an exported GGUF in llama.cpp and its Ollama Modelfile against the "
                                          "run it came from")
        for act, tip in ((self.act_resume, RESUME_TIP),
                         (self.act_stop, "Stop after the current step and save a checkpoint")):
            act.setToolTip(tip)
        for act in (self.act_resume, self.act_stop, self.act_export, self.act_export_model):
            act.setEnabled(False)  # until a run is shown (``_update_actions``)

    def _layout(self) -> None:
        split = QtWidgets.QSplitter()
        split.addWidget(self.run_list)
        split.addWidget(self.run_view)
        split.setStretchFactor(0, 1)  # a narrower window takes a quarter of the width from the list
        split.setStretchFactor(1, 3)
        split.setCollapsible(0, False)  # the runs list never vanishes at 800×600
        split.setSizes([420, 860])
        central = QtWidgets.QWidget()
        lay = QtWidgets.QVBoxLayout(central)
        lay.setContentsMargins(6, 6, 6, 6)
        lay.addWidget(self.header)
        lay.addWidget(split, 1)
        self.setCentralWidget(central)
        screen = QtGui.QGuiApplication.primaryScreen()
        room = screen.availableGeometry().size() if screen is not None else QtCore.QSize(1280, 820)
        self.resize(min(1280, room.width()), min(820, room.height()))  # the status bar stays on a 1280×800 screen
        self.state_label = QtWidgets.QLabel()  # the selected run's state, as the runs list and the CLI say it
        self.state_label.setObjectName("run_state")
        self.statusBar().addPermanentWidget(self.state_label)

    def _connect(self) -> None:
        self.hardware.snapshot.connect(self._on_snapshot)
        self.hardware.failed.connect(self.header.show_problem)
        self.monitor.runs.connect(self.run_list.show_runs)
        self.monitor.selected.connect(self.run_view.bind)
        self.monitor.tick.connect(self._on_tick)
        self.run_list.selected.connect(self.monitor.select)
        self.runs.message.connect(lambda text: self.statusBar().showMessage(text, 15000))
        self.runs.launched.connect(self._on_launched)
        self.runs.exited.connect(self._on_exited)
        self.runs.stop_overdue.connect(self._ask_kill)
        self.runs.refused.connect(self._on_refused)
        self.monitor.tick.connect(self._forget_started_wizards)
        self.run_view.warnings.end_process.connect(self._ask_end_process)
        self.notifier = RunEndNotifier(self)  # desktop notification when a watched run ends
        self.monitor.runs.connect(self.notifier.observe)

    def finish_startup(self) -> None:
        """Build the plots, start watching runs and probing, reopen the last run (idempotent)."""
        if self.started:
            return
        self.started = True
        self.run_view.build_dashboard()
        self.monitor.start()
        self.hardware.start()
        last = settings.settings().value("last_run")
        if last and Path(last).is_dir():
            self.run_list.select_path(str(Path(last).resolve()))
            self.monitor.select(str(Path(last).resolve()))
        else:
            self.monitor.select(None)
        # Everything made so far (Qt wrappers, pyqtgraph, numpy) lives as long as the window: keep
        # it out of the cycle collector's full passes, which stop every thread while they walk it.
        gc.freeze()
        self.startup_done.emit()

    # -- ticks ----------------------------------------------------------------------------------
    def _on_snapshot(self, snap) -> None:
        self.header.show_snapshot(snap)
        if self.monitor.current is None or not self.monitor.current.is_alive():
            self.monitor.add_machine_snapshot(snap)

    def _on_tick(self) -> None:
        data = self.monitor.shown()
        if data is None:
            return
        run_dir = str(data.run_dir) if data.run_dir else None
        own = set(self.runs.tree_pids(run_dir, data.run_state.pid if data.run_state else None)) if run_dir else set()
        full = self.hardware.processes_snapshot()
        live = full.to_dict() if full is not None and (run_dir is None or data.is_alive()) else None
        self.run_view.refresh(advice.collect(data, live, own))
        self._update_actions(data)

    def _update_actions(self, data) -> None:
        """Every button asks the run's state (runstate, through ``data``): Stop only while the run is
        live, Resume only when it is resumable."""
        live = data.run_dir is not None and data.is_live()
        stopping = live and (self.runs.is_stopping(str(data.run_dir)) or data.state == "stopping")
        self.act_stop.setEnabled(live and not stopping)
        self.act_stop.setText("Saving checkpoint…" if stopping else "Stop")
        self.act_resume.setEnabled(data.run_dir is not None and data.resumable())
        self.act_resume.setToolTip(resume_tip(data))
        self.act_export.setEnabled(data.run_dir is not None and (data.run_dir / "config.yaml").exists())
        self.act_export_model.setEnabled(data.run_dir is not None and data.run_state is not None
                                         and data.run_state.model is not None)  # runstate: what Try it loads
        self.act_export_model.setToolTip("Export the trained model (safetensors, GGUF, Ollama)" if
                                         self.act_export_model.isEnabled() else "No trained model in this run yet "
                                         "(a checkpoint or final/ appears as it trains)")
        self.state_label.setText(state_line(data))

    # -- intents --------------------------------------------------------------------------------
    def open_run(self, run_dir: str) -> None:
        """Show a run folder (also one made from a terminal) and remember it."""
        path = str(Path(run_dir).resolve())
        settings.remember_run(path)
        self.monitor.rescan()
        self.run_list.select_path(path)
        self.monitor.select(path)

    def _ask_open_folder(self) -> None:
        folder = QtWidgets.QFileDialog.getExistingDirectory(self, "Open a run folder", str(settings.runs_dir()))
        if folder:
            self.open_run(folder)

    def start_demo(self, overrides: tuple[str, ...] = ()) -> str:
        """Start the tiny CPU demo in a new run folder (``--set`` overrides). Returns the folder. The button rests
        for two seconds, so a double click starts one run, not two (each click would get its own folder)."""
        self.act_demo.setEnabled(False)
        QtCore.QTimer.singleShot(DEMO_CLICK_REST_MS, self.act_demo, lambda: self.act_demo.setEnabled(True))
        run_dir = settings.runs_dir() / QtCore.QDateTime.currentDateTime().toString("'demo-'yyyyMMdd-HHmmss")
        self.runs.start_demo(str(run_dir), overrides)
        return str(run_dir)

    def start_config(self, config_path: str, run_dir: str) -> None:
        """Start ``config_path`` into ``run_dir``. From the wizard, it is kept (hidden) until the run
        is under way, so a failed start returns to it with every value."""
        self.runs.start(config_path, run_dir)

    def _selected_dir(self) -> str | None:
        d = self.monitor.current
        return str(d.run_dir) if d is not None else None

    def stop_selected(self) -> None:
        """Graceful stop of the selected run."""
        if self._selected_dir():
            self.runs.stop(self._selected_dir())

    def resume_selected(self) -> None:
        """Resume the selected run; where this machine offers a choice of GPUs (several, or fewer than the run
        trained on), ask how many first (``ResumeDialog``)."""
        run = self._selected_dir()
        if not run:
            return
        snapshot = self.hardware.planning_snapshot()
        if resume_choice.needs_choice(run, snapshot):
            dialog = ResumeDialog(run, snapshot, parent=self)
            dialog.chosen.connect(lambda sets: self.runs.resume(run, sets))
            dialog.open()
            self.resume_dialog = dialog
            return
        self.runs.resume(run)

    def export_selected(self) -> None:
        """Export the selected run's config and launch scripts."""

        if self._selected_dir():
            ExportDialog(self._selected_dir(), parent=self).open()

    def export_model_selected(self) -> None:
        """Export the selected run's trained model (safetensors, GGUF, Modelfile) with a progress bar."""
        run_dir = self._selected_dir()
        if run_dir:
            ExportModelDialog(run_dir, self).open()

    def verify_export(self) -> None:
        """Check an export folder again (``trainpilot-cli verify-export``), the selected run's exports folder first."""
        run_dir = self._selected_dir()
        start = str(Path(run_dir).parent.parent / "exports" / Path(run_dir).name) if run_dir else ""
        VerifyExportDialog(start, self).open()

    def open_wizard(self) -> None:
        """Open the setup wizard (non-modal). A wizard whose run failed to start comes back with the
        user's values; otherwise a fresh one."""
        if self.wizard is not None and self.wizard.isVisible():
            self.wizard.raise_()
            return
        self.wizard = SetupWizard(self.hardware, parent=self)
        self.wizard.start_requested.connect(lambda c, r, w=self.wizard: self._start_from_wizard(w, c, r))
        self.wizard.show()

    def _start_from_wizard(self, wizard, config_path: str, run_dir: str) -> None:
        self._wizard_runs[run_dir] = (wizard, config_path)
        wizard.hide()
        self.start_config(config_path, run_dir)

    # -- events from controllers ----------------------------------------------------------------
    def _on_launched(self, run_dir: str) -> None:
        if Path(run_dir).exists():
            self.open_run(run_dir)
        else:  # the supervisor makes the folder after planning; a window closed meanwhile is not asked
            QtCore.QTimer.singleShot(1000, self, lambda: self._on_launched(run_dir))

    def _on_exited(self, run_dir: str, code: int, stderr_tail: str) -> None:
        wizard, config_path = self._wizard_runs.pop(run_dir, (None, None))
        if code != 0:
            failed_start.record(run_dir, config_path, code, stderr_tail, self.runs.log_stem(run_dir))
        self.monitor.rescan()
        if code == 0:
            return
        if wizard is not None:
            self.open_run(run_dir)  # the failed run is listed, with its log
            self.wizard = wizard
            wizard.show_start_failure(code, stderr_tail)
            return
        box = QtWidgets.QMessageBox(QtWidgets.QMessageBox.Warning, "Run ended",
                                    failed_start.ended_message(Path(run_dir).name, code, read_run_state(run_dir),
                                                               stderr_tail), parent=self)
        if stderr_tail:
            box.setDetailedText(stderr_tail)  # the output's last lines, behind "Show Details…" (also the Log tab)
        box.open()

    def _on_refused(self, run_dir: str, why: str) -> None:
        wizard, _ = self._wizard_runs.pop(run_dir, (None, None))
        if wizard is not None:
            self.wizard = wizard
            wizard.show_start_failure(2, why)
        else:
            self.statusBar().showMessage(f"Not started: {why}", 15000)

    def _forget_started_wizards(self) -> None:
        """A wizard's run that reached its first step is under way: its wizard is done."""
        d = self.monitor.current
        if d is not None and d.last_step and str(d.run_dir) in {str(Path(r).resolve()) for r in self._wizard_runs}:
            for r in [r for r in self._wizard_runs if str(Path(r).resolve()) == str(d.run_dir)]:
                wizard, _ = self._wizard_runs.pop(r)
                if wizard is not self.wizard:
                    wizard.deleteLater()
                elif not wizard.isVisible():
                    self.wizard = None

    def _ask_kill(self, run_dir: str) -> None:
        answer = QtWidgets.QMessageBox.question(
            self, "Run is not stopping",
            f"{Path(run_dir).name} has not stopped after {self.runs.stop_timeout_s:.0f} s. Kill it and all its "
            "processes? Progress after the last checkpoint is lost; Resume continues from that checkpoint.")
        if answer == QtWidgets.QMessageBox.Yes:
            self.runs.kill_tree(run_dir)

    def _ask_end_process(self, pid: int, name: str) -> None:
        answer = QtWidgets.QMessageBox.question(
            self, f"End {name}?", f"End {name} (pid {pid})? Unsaved work in it will be lost.")
        if answer == QtWidgets.QMessageBox.Yes:
            self.runs.end_process(pid, name)  # terminate and wait off the GUI thread

    def paintEvent(self, event: QtGui.QPaintEvent) -> None:
        super().paintEvent(event)
        if not self.started and not getattr(self, "_painted_once", True):
            self._painted_once = True
            QtCore.QTimer.singleShot(0, self.finish_startup)

    # -- closing --------------------------------------------------------------------------------
    def alive_runs(self) -> list[str]:
        """Run folders whose supervisor is alive."""
        out = [d for d in self.runs.children if self.runs.supervisor_pid(d)]
        cur = self.monitor.current
        if cur is not None and cur.is_alive() and str(cur.run_dir) not in out:
            out.append(str(cur.run_dir))
        return out

    def ask_close_choice(self, runs: list[str]) -> str:
        """Ask what to do with live runs: KEEP, STOP_AND_SAVE or CANCEL."""
        box = QtWidgets.QMessageBox(QtWidgets.QMessageBox.Question, "Training is running", close_question(runs),
                                    parent=self)
        keep = box.addButton("Keep training in the background", QtWidgets.QMessageBox.AcceptRole)
        stop = box.addButton("Stop and save", QtWidgets.QMessageBox.DestructiveRole)
        box.addButton(QtWidgets.QMessageBox.Cancel)
        box.exec()
        return KEEP if box.clickedButton() is keep else STOP_AND_SAVE if box.clickedButton() is stop else CANCEL

    def stop_before_closing(self, runs: list[str]) -> bool:
        """Write each run's stop request, then wait (events keep flowing) until every run has
        stopped, the user chooses to close meanwhile, or says why not. True: close now."""
        failed = [r for r in runs if not self.runs.stop(r)]
        if failed:
            QtWidgets.QMessageBox.warning(self, "Could not stop", "The stop request could not be written for "
                                          + ", ".join(Path(r).name for r in failed) + "; the window stays open.")
            return False
        waiter = StopWaiter(runs, self)
        return waiter.wait()

    def closeEvent(self, event: QtGui.QCloseEvent) -> None:
        live = self.alive_runs()
        if live:
            choice = self.ask_close_choice(live)
            if choice == CANCEL:
                event.ignore()
                return
            if choice == STOP_AND_SAVE and not self.stop_before_closing(live):
                event.ignore()
                return
        settings.settings().setValue("geometry", self.saveGeometry())
        self.hardware.stop()
        background.abandon_background()  # verdicts still being judged are for nobody now: quitting does not wait
        event.accept()


DEMO_CLICK_REST_MS = 2000


def state_line(data) -> str:
    """'demo-1: failed' for the status bar (the selected run's effective state), '' for the machine."""
    if data.run_dir is None:
        return ""
    return f"{data.run_dir.name}: {data.state}"


def resume_tip(data) -> str:
    """Why Resume is (not) possible for the shown run."""
    rs = data.run_state
    if data.run_dir is None or rs is None:
        return RESUME_TIP
    if rs.resumable:
        return f"Continue from checkpoint {rs.checkpoint_step}"
    if rs.alive:
        return "The run is still going; Stop it first"
    if rs.state == "finished":
        return "The run has finished"
    return "No complete checkpoint: nothing to resume from"
