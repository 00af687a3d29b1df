@echo off
rem Double-click to install TrainPilot for this user (into %LOCALAPPDATA%\TrainPilot).
rem Runs install.ps1 next to this file; any arguments are passed on (e.g. -TorchBuild cpu).
setlocal
set "HERE=%~dp0"
if not exist "%HERE%install.ps1" (
  echo install.ps1 is missing next to this file. Unpack the whole TrainPilot ZIP first,
  echo then double-click installers\windows\install.bat in the unpacked folder.
  pause
  exit /b 1
)
echo Installing TrainPilot. This downloads Python packages (several GB for GPU builds of PyTorch).
echo A log is written to install.log in the install folder.
echo.
powershell.exe -NoLogo -NoProfile -ExecutionPolicy Bypass -File "%HERE%install.ps1" %*
set "RC=%ERRORLEVEL%"
echo.
if "%RC%"=="0" (
  echo Done. Start TrainPilot from the shortcut on your Desktop or in the Start menu.
) else (
  echo The install did not finish. The message above says what to do.
)
if not defined TRAINPILOT_NO_PAUSE pause
exit /b %RC%
