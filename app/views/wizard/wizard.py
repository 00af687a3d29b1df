"""The setup wizard: five pages (six for GRPO: Rewards after Data) bound to one WizardState (config values + planner)."""
from __future__ import annotations

from PySide6 import QtCore, QtWidgets

from app.views.export_dialog import ExportDialog
from app.views.wizard.page_data import DataPage
from app.views.wizard.page_env import EnvironmentPage
from app.views.wizard.page_model import ModelPage
from app.views.wizard.page_plan import PlanPage
from app.views.wizard.page_review import ReviewPage
from app.views.wizard.page_rewards import RewardPage
from app.views.wizard.state import WizardState


class SetupWizard(QtWidgets.QWizard):
    """Emits ``start_requested(config_path, run_dir)`` when the user presses Start."""
    start_requested = QtCore.Signal(str, str)

    def __init__(self, hardware, parent=None):
        super().__init__(parent)
        self.setWindowTitle("New training run")
        self.setWizardStyle(QtWidgets.QWizard.ClassicStyle)
        self.setOption(QtWidgets.QWizard.NoCancelButtonOnLastPage, False)
        self.setButtonText(QtWidgets.QWizard.FinishButton, "Close")  # Start is the button that starts
        self.resize(900, 680)
        self.state = WizardState(hardware, self)
        self.env = EnvironmentPage(replay_file=getattr(hardware, "hardware_file", None), state=self.state)
        self.model = ModelPage(self.state)
        self.data = DataPage(self.state)
        self.rewards = RewardPage(self.state)  # GRPO only: the Data page skips it for other objectives
        self.plan = PlanPage(self.state)
        self.review = ReviewPage(self.state)
        for page in (self.env, self.model, self.data, self.rewards, self.plan, self.review):
            self.addPage(page)
        self.review.start.connect(self._start)
        self.review.export.connect(self._export)

    def keyPressEvent(self, event) -> None:
        """Enter in a text field takes the value (the field validates it and its page shows the
        result) instead of pressing Next before the user has seen it."""
        if event.key() in (QtCore.Qt.Key_Return, QtCore.Qt.Key_Enter) and \
                isinstance(self.focusWidget(), QtWidgets.QLineEdit):
            event.accept()
            return
        super().keyPressEvent(event)

    def _start(self, config_path: str, run_dir: str) -> None:
        # The main window hides this wizard while the run starts and shows it again if it fails.
        self.start_requested.emit(config_path, run_dir)

    def show_start_failure(self, code: int, text: str) -> None:
        """Come back on Review with every value kept and the error shown."""
        self.show()
        self.raise_()
        while self.currentPage() is not self.review and self.currentId() != -1:
            self.next()
        self.review.show_start_failure(code, text)

    def _export(self, config_path: str) -> None:

        self.export_dialog = ExportDialog(config_path, parent=self)
        self.export_dialog.open()
