@echo off
rem Starts the TrainPilot window without a console, from any current directory: every path is
rem taken from this file's own folder (%~dp0). The installer copies this file into its prefix;
rem run from the source tree, it uses %TRAINPILOT_PREFIX% or %LOCALAPPDATA%\TrainPilot.
setlocal
set "TP_PREFIX=%~dp0"
if exist "%TP_PREFIX%venv\Scripts\pythonw.exe" goto found
if defined TRAINPILOT_PREFIX (
  set "TP_PREFIX=%TRAINPILOT_PREFIX%\"
) else (
  set "TP_PREFIX=%LOCALAPPDATA%\TrainPilot\"
)
if exist "%TP_PREFIX%venv\Scripts\pythonw.exe" goto found
echo TrainPilot is not installed in "%TP_PREFIX%".
echo Double-click installers\windows\install.bat first; it writes install.log in that folder.
pause
exit /b 1

:found
set "TRAINPILOT_INSTALL_STATE=%TP_PREFIX%install-state.json"
rem start "" returns at once, so this console closes; trainpilot.exe is a windowed program.
if exist "%TP_PREFIX%venv\Scripts\trainpilot.exe" (
  start "" "%TP_PREFIX%venv\Scripts\trainpilot.exe" %*
) else (
  start "" "%TP_PREFIX%venv\Scripts\pythonw.exe" -m app.main %*
)
exit /b 0
