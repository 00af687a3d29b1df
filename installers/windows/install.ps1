# Install TrainPilot for this Windows user. Started by install.bat (double-click); also runs as
#   powershell -ExecutionPolicy Bypass -File install.ps1 [-Prefix DIR] [-TorchBuild auto|cpu|cu126|cu128|cu130]
# Steps: find or install Python 3.10+, create PREFIX\venv, choose the PyTorch build for the NVIDIA GPU
# and driver (installers\torch_build.py decides and says why), install it and TrainPilot, try
# DeepSpeed and record whether it works (PREFIX\install-state.json), add the GPU extras beside a CUDA
# PyTorch (bitsandbytes; liger-kernel only where Triton works: installers\gpu_extras.py decides and
# says why), fetch llama.cpp's GGUF converter (PREFIX\llama.cpp), add Desktop and Start-menu
# shortcuts that open the GUI without a console window. Running it again repairs or updates.
# Everything is logged to PREFIX\install.log. Windows PowerShell 5.1 and PowerShell 7 both run it.
[CmdletBinding()]
param(
    [string]$Prefix = (Join-Path $env:LOCALAPPDATA 'TrainPilot'),
    [string]$TorchBuild = 'auto',
    [string]$Python = '',
    [switch]$Upgrade,
    [switch]$NoDeepSpeed,
    [switch]$NoGpuExtras,
    [switch]$NoShortcuts,
    [switch]$NoLlamaCpp,
    [int]$DeepSpeedTimeoutMinutes = 20
)

$ErrorActionPreference = 'Stop'
$ProgressPreference = 'SilentlyContinue'   # Invoke-WebRequest is many times slower with the bar
$RepoRoot = (Resolve-Path (Join-Path $PSScriptRoot '..\..')).Path
$PythonInstallerUrl = 'https://www.python.org/ftp/python/3.12.10/python-3.12.10-amd64.exe'
$script:Step = 'starting'
$script:Hint = ''

New-Item -ItemType Directory -Force -Path $Prefix | Out-Null
$Prefix = (Resolve-Path $Prefix).Path
$Venv = Join-Path $Prefix 'venv'
$VenvPy = Join-Path $Venv 'Scripts\python.exe'
$Log = Join-Path $Prefix 'install.log'

function Write-Log([string]$Text) {
    Write-Host $Text
    Add-Content -Path $Log -Value $Text -Encoding UTF8
}

function Start-Step([string]$Name, [string]$WhatToDo) {
    $script:Step = $Name
    $script:Hint = $WhatToDo
    Write-Log ''
    Write-Log "--- $Name"
}

# The one way an install ends badly: plain words, what to do, where the log is.
function Stop-Install([string]$Message) {
    Write-Log ''
    Write-Log "TrainPilot install FAILED while: $script:Step"
    if ($Message) { Write-Log "  $Message" }
    if ($script:Hint) { Write-Log "What to do: $script:Hint" }
    Write-Log "Full log: $Log"
    exit 1
}

# Runs a program, shows and logs its output line by line, returns its exit code. Stderr is merged
# here on purpose: with 'Stop', Windows PowerShell 5.1 would turn pip's warnings into errors.
function Invoke-Logged([string]$Exe, [string[]]$Arguments) {
    Add-Content -Path $Log -Value "> $Exe $($Arguments -join ' ')" -Encoding UTF8
    $ErrorActionPreference = 'Continue'
    # Add-Content per line, not Tee-Object: 5.1's Tee-Object writes UTF-16 into a UTF-8 log.
    & $Exe @Arguments 2>&1 | ForEach-Object {
        $line = "$_"
        Add-Content -Path $Log -Value $line -Encoding UTF8
        Write-Host $line
    }
    return $LASTEXITCODE
}

function Test-Python([string]$Exe, [string[]]$Pre = @()) {
    try {
        $ErrorActionPreference = 'Continue'
        # Python code passed to a program: no double quotes (5.1 does not escape them for native programs).
        $out = & $Exe @Pre -c "import sys, venv; print(sys.executable if sys.version_info >= (3, 10) else '')" 2>$null
        if ($LASTEXITCODE -eq 0 -and $out) { return ($out | Select-Object -Last 1).Trim() }
    } catch { }
    return $null
}

function Find-Python {
    if ($Python) { return (Test-Python $Python) }
    # The py launcher knows every python.org install; prefer versions every dependency has wheels for.
    if (Get-Command py -ErrorAction SilentlyContinue) {
        foreach ($v in @('3.12', '3.11', '3.13', '3.10')) {
            $found = Test-Python 'py' @("-$v")
            if ($found) { return $found }
        }
    }
    # 'python' on PATH may be the Microsoft Store stub, which Test-Python rejects (it prints nothing).
    foreach ($name in @('python', 'python3')) {
        if (Get-Command $name -ErrorAction SilentlyContinue) {
            $found = Test-Python $name
            if ($found) { return $found }
        }
    }
    $local = Join-Path $env:LOCALAPPDATA 'Programs\Python\Python312\python.exe'
    if (Test-Path $local) { return (Test-Python $local) }
    return $null
}

function Install-Python {
    if (Get-Command winget -ErrorAction SilentlyContinue) {
        Write-Log 'Installing Python 3.12 for this user with winget...'
        $rc = Invoke-Logged 'winget' @('install', '--id', 'Python.Python.3.12', '-e', '--scope', 'user', '--silent',
                                       '--accept-package-agreements', '--accept-source-agreements')
        if ($rc -eq 0) { return }
    }
    Write-Log "Downloading the Python 3.12 installer from python.org..."
    $exe = Join-Path $env:TEMP 'trainpilot-python-3.12-amd64.exe'
    Invoke-WebRequest -Uri $PythonInstallerUrl -OutFile $exe -UseBasicParsing
    $p = Start-Process -FilePath $exe -Wait -PassThru -ArgumentList @(
        '/quiet', 'InstallAllUsers=0', 'Include_launcher=1', 'PrependPath=0', 'Include_test=0')
    if ($p.ExitCode -ne 0) { Stop-Install "The Python installer exited with code $($p.ExitCode)." }
}

function New-Venv([string]$BasePy) {
    if ((Test-Path $VenvPy) -and (Test-Python $VenvPy)) {
        Write-Log "Reusing the environment in $Venv"
    } else {
        if (Test-Path $Venv) { Remove-Item -Recurse -Force $Venv }
        if ((Invoke-Logged $BasePy @('-m', 'venv', $Venv)) -ne 0) { Stop-Install 'python -m venv failed.' }
    }
    if ((Invoke-Logged $VenvPy @('-m', 'pip', 'install', '--upgrade', 'pip')) -ne 0) {
        Stop-Install 'Could not update pip in the new environment.'
    }
}

function Get-TorchDecision {
    $json = & $VenvPy (Join-Path $RepoRoot 'installers\torch_build.py') '--build' $TorchBuild '--json'
    $text = ($json -join "`n")
    Set-Content -Path (Join-Path $Prefix 'torch-decision.json') -Value $text -Encoding UTF8
    return ($text | ConvertFrom-Json)
}

function Test-TorchBuild([string]$Build) {
    $code = "import torch,sys; v=torch.__version__; c=torch.version.cuda; " +
            "have=v.split('+',1)[1] if '+' in v else ('cu'+c.replace('.','') if c else 'cpu'); sys.exit(have!=sys.argv[1])"
    $ErrorActionPreference = 'Continue'
    & $VenvPy -c $code $Build 2>$null | Out-Null
    return ($LASTEXITCODE -eq 0)
}

function Install-Torch($Decision) {
    if (-not $Decision.ok) { $script:Hint = $Decision.reason; Stop-Install 'No PyTorch build fits this machine.' }
    if (-not $Upgrade -and (Test-TorchBuild $Decision.build)) {
        Write-Log "PyTorch build $($Decision.build) is already installed."
        return $Decision.build
    }
    $builds = @($Decision.build) + @($Decision.fallbacks)
    foreach ($build in $builds) {
        # A torch of another build satisfies the requirement, so pip would keep it: remove it first.
        Invoke-Logged $VenvPy @('-m', 'pip', 'uninstall', '-y', 'torch') | Out-Null
        $req = (& $VenvPy (Join-Path $RepoRoot 'installers\torch_build.py') '--build' $build '--json' |
                Out-String | ConvertFrom-Json).torch_requirement
        Write-Log "Installing PyTorch ($build, $req) from https://download.pytorch.org/whl/$build (CUDA builds are several GB)"
        # PyPI is left out on purpose: its Windows torch is the CPU build, and pip could prefer it.
        $rc = Invoke-Logged $VenvPy @('-m', 'pip', 'install', $req, '--index-url', "https://download.pytorch.org/whl/$build")
        # A pip.ini with extra indexes can hand over another build: check, never assume.
        if ($rc -eq 0 -and (Test-TorchBuild $build)) { return $build }
        if ($rc -eq 0) { Write-Log "pip installed another PyTorch build than $build (check pip.ini / PIP_* settings)." }
        Write-Log "PyTorch build $build did not install; trying the next one."
    }
    Stop-Install "PyTorch did not install from any of: $($builds -join ', ')"
}

# configs\ is found next to the trainer package, so the whole source tree is copied into the
# prefix and installed in editable mode: the install no longer needs the folder it came from.
function Copy-Source {
    $src = Join-Path $Prefix 'src'
    $staging = Join-Path $Prefix 'src.new'
    if (Test-Path $staging) { Remove-Item -Recurse -Force $staging }
    New-Item -ItemType Directory -Path $staging | Out-Null
    foreach ($item in @('app', 'trainer', 'configs', 'installers', 'pyproject.toml', 'setup.py', 'README.md', 'LICENSE')) {
        $path = Join-Path $RepoRoot $item
        if (Test-Path $path) { Copy-Item -Recurse -Force -Path $path -Destination $staging }
    }
    Get-ChildItem -Path $staging -Recurse -Directory -Filter '__pycache__' | Remove-Item -Recurse -Force
    if (-not (Test-Path (Join-Path $staging 'README.md'))) { Set-Content (Join-Path $staging 'README.md') '# TrainPilot' }
    if (Test-Path $src) { Remove-Item -Recurse -Force $src }
    Rename-Item -Path $staging -NewName 'src'
    return $src
}

# DeepSpeed often cannot build on Windows; a hung build is the classic failure, so it gets a time
# limit. Its failure never fails the install: the planner then uses the non-DeepSpeed presets.
function Install-DeepSpeed {
    if ($NoDeepSpeed) { return 'skipped (-NoDeepSpeed)' }
    $env:DS_BUILD_OPS = '0'
    # Without build isolation its setup.py runs in this environment, which has no setuptools of its own.
    Invoke-Logged $VenvPy @('-m', 'pip', 'install', 'setuptools', 'wheel', 'packaging') | Out-Null
    $out = Join-Path $Prefix 'deepspeed-pip.log'
    $err = Join-Path $Prefix 'deepspeed-pip.err.log'
    $p = Start-Process -FilePath $VenvPy -NoNewWindow -PassThru -RedirectStandardOutput $out -RedirectStandardError $err `
        -ArgumentList @('-m', 'pip', 'install', '--no-build-isolation', 'deepspeed')
    $null = $p.Handle   # without this, ExitCode stays empty after WaitForExit (a .NET quirk)
    $deadline = (Get-Date).AddMinutes($DeepSpeedTimeoutMinutes)
    while (-not $p.WaitForExit(30000)) {
        if ((Get-Date) -gt $deadline) {
            & taskkill.exe /T /F /PID $p.Id | Out-Null
            return "pip install deepspeed took longer than $DeepSpeedTimeoutMinutes minutes and was stopped"
        }
        Write-Host '  still working on DeepSpeed...'
    }
    foreach ($f in @($out, $err)) { if (Test-Path $f) { Get-Content $f | Add-Content -Path $Log -Encoding UTF8 } }
    if ($p.ExitCode -ne 0) { return "pip install deepspeed failed (exit code $($p.ExitCode)); details in install.log" }
    return ''
}

# bitsandbytes (QLoRA, 8-bit AdamW) and liger-kernel (Liger's fused loss) beside a CUDA PyTorch. Which ones,
# and why not the others, is installers\gpu_extras.py's answer (shared with the Linux installer); each is
# pinned by its pyproject extra. A failure never fails the install. Returns the arguments for install_state.py.
function Install-GpuExtras([string]$Src, [string]$Build) {
    if ($NoGpuExtras) { return @() }
    $ErrorActionPreference = 'Continue'
    & $VenvPy -c 'import triton' 2>$null | Out-Null
    $triton = 'no'
    if ($LASTEXITCODE -eq 0) { $triton = 'yes' }
    $planFile = Join-Path $Prefix 'gpu-extras.json'
    $torchVersion = (& $VenvPy -c 'import torch; print(torch.__version__)' 2>$null | Select-Object -Last 1)
    $plan = @('--torch-build', $Build, '--platform', 'windows', '--triton', $triton, '--torch-version', "$torchVersion")
    $json = & $VenvPy (Join-Path $RepoRoot 'installers\gpu_extras.py') @plan '--json'
    $text = ($json -join "`n")
    Set-Content -Path $planFile -Value $text -Encoding UTF8
    $stateArgs = @('--gpu-extras', $planFile)
    foreach ($extra in ($text | ConvertFrom-Json)) {
        Write-Log $extra.reason
        if (-not $extra.install) { continue }
        if ($extra.pip.Count -gt 0) {  # torchvision: the release paired with the installed torch, which stays pinned
            $rc = Invoke-Logged $VenvPy (@('-m', 'pip', 'install') + @($extra.pip))
            if ($rc -ne 0) {
                Write-Log "It did not install; only Qwen2.5-VL's and Qwen3-VL's processors need it (see install.log)."
                $stateArgs += @('--extra-error', "torchvision=pip could not install it (see install.log); only Qwen2.5-VL's and Qwen3-VL's processors need it")
            }
            continue
        }
        $rc = Invoke-Logged $VenvPy @('-m', 'pip', 'install', '-e', "$Src[$($extra.extra)]")
        if ($rc -ne 0) {
            Write-Log "It did not install; TrainPilot works without it (see install.log)."
            $stateArgs += @('--extra-error', "$($extra.extra)=pip could not install it (see install.log); TrainPilot works without it")
        }
    }
    return $stateArgs
}

# llama-cpp-python runs llama.cpp itself: export-model verifies every GGUF export in it (and quantizes to Q4_K_M).
# PyPI has only its source; building it on Windows needs the Visual Studio C++ Build Tools (cl.exe). Without them,
# or when the build fails, the install goes on and says so: exports are then written and say "not verified".
function Install-LlamaCppPython {
    if ($NoLlamaCpp) { return 'skipped (-NoLlamaCpp)' }
    if ((Invoke-Logged $VenvPy @('-c', 'import llama_cpp')) -eq 0 -and -not $Upgrade) { return '' }
    $vswhere = Join-Path ${env:ProgramFiles(x86)} 'Microsoft Visual Studio\Installer\vswhere.exe'
    $hasCl = (Get-Command cl.exe -ErrorAction SilentlyContinue) -or ((Test-Path $vswhere) -and
        (& $vswhere -latest -products * -requires Microsoft.VisualStudio.Component.VC.Tools.x86.x64 -property installationPath))
    if (-not $hasCl) {
        return 'no C++ compiler to build llama-cpp-python (install the Visual Studio Build Tools with "Desktop development with C++", then run install.bat again); exports are written but not verified in llama.cpp'
    }
    Write-Host '  building llama-cpp-python (llama.cpp for Python): about 15 minutes...'
    $env:CMAKE_ARGS = '-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF'
    if ((Invoke-Logged $VenvPy @('-m', 'pip', 'install', 'llama-cpp-python==0.3.36')) -ne 0) {
        return 'llama-cpp-python did not build (details in install.log); exports are written but not verified in llama.cpp'
    }
    return ''
}

function New-Shortcut([string]$Path, [string]$Target, [string]$Arguments, [string]$Icon) {
    $shell = New-Object -ComObject WScript.Shell
    $link = $shell.CreateShortcut($Path)
    $link.TargetPath = $Target
    $link.Arguments = $Arguments
    $link.WorkingDirectory = $env:USERPROFILE
    $link.IconLocation = "$Icon,0"
    $link.Description = 'TrainPilot: fit LLM training to your GPU'
    $link.Save()
}

function Install-Launchers([string]$Src) {
    Copy-Item -Force (Join-Path $RepoRoot 'installers\windows\TrainPilot.bat') $Prefix
    $icon = Join-Path $Prefix 'trainpilot.ico'
    Copy-Item -Force (Join-Path $Src 'app\resources\icons\trainpilot.ico') $icon
    # The gui-script trainpilot.exe is a windowed program: no console window opens.
    $target = Join-Path $Venv 'Scripts\trainpilot.exe'
    $arguments = ''
    if (-not (Test-Path $target)) { $target = Join-Path $Venv 'Scripts\pythonw.exe'; $arguments = '-m app.main' }
    if ($NoShortcuts) { return }
    $desktop = [Environment]::GetFolderPath('Desktop')
    $programs = [Environment]::GetFolderPath('Programs')
    foreach ($dir in @($desktop, $programs)) {
        New-Shortcut (Join-Path $dir 'TrainPilot.lnk') $target $arguments $icon
        Write-Log "Shortcut: $(Join-Path $dir 'TrainPilot.lnk')"
    }
}

function Invoke-Main {
    Write-Log "=== TrainPilot install $((Get-Date).ToUniversalTime().ToString('s'))Z: prefix=$Prefix source=$RepoRoot"

    Start-Step 'checking the TrainPilot folder' 'Unpack the whole TrainPilot ZIP into a folder, then double-click installers\windows\install.bat inside it.'
    if (-not (Test-Path (Join-Path $RepoRoot 'pyproject.toml'))) { Stop-Install "$RepoRoot does not hold the TrainPilot sources." }

    Start-Step 'finding Python 3.10 or newer' 'Install Python 3.12 from python.org (tick "py launcher"), then double-click install.bat again.'
    $basePy = Find-Python
    if (-not $basePy) {
        Install-Python
        $env:Path = [Environment]::GetEnvironmentVariable('Path', 'User') + ';' + [Environment]::GetEnvironmentVariable('Path', 'Machine')
        $basePy = Find-Python
    }
    if (-not $basePy) { Stop-Install 'No Python 3.10+ was found, and installing one did not work.' }
    Write-Log "Using $basePy"

    Start-Step "creating the environment in $Venv" "Check free disk space on the drive of $Prefix, then run install.bat again (it recreates a broken environment)."
    New-Venv $basePy

    Start-Step 'choosing the PyTorch build for this GPU' 'Run nvidia-smi in a terminal to check the NVIDIA driver, or run install.bat -TorchBuild cpu.'
    $decision = Get-TorchDecision
    $gpuText = ($decision.gpus | ForEach-Object { "$($_.name) (driver $($_.driver_version))" }) -join '; '
    if (-not $gpuText) { $gpuText = 'none found' }
    Write-Log "GPU: $gpuText"
    Write-Log "PyTorch build: $($decision.build). $($decision.reason)"

    Start-Step "installing PyTorch ($($decision.build))" 'Check the internet connection to download.pytorch.org and free disk space (CUDA builds need about 6 GB), then run install.bat again.'
    $build = Install-Torch $decision
    Write-Log "Installed PyTorch build $build"

    Start-Step 'installing TrainPilot' 'Check the internet connection, then run install.bat again.'
    $src = Copy-Source
    if ((Invoke-Logged $VenvPy @('-m', 'pip', 'install', '-e', "$src[gui,train]")) -ne 0) { Stop-Install 'pip could not install TrainPilot.' }

    Start-Step 'trying DeepSpeed' ''
    $dsError = Install-DeepSpeed
    if ($dsError) { Write-Log "DeepSpeed: $dsError. TrainPilot works without it (non-DeepSpeed presets)." }

    Start-Step 'trying the GPU extras' ''
    $extraArgs = @(Install-GpuExtras $src $build)

    # export-model --gguf runs llama.cpp's own converter from the pinned llama-cpp-python sources.
    Start-Step "fetching llama.cpp's GGUF converter" ''
    $fetch = @((Join-Path $RepoRoot 'installers\fetch_llama_cpp.py'), '--dest', (Join-Path $Prefix 'llama.cpp'))
    if ((Invoke-Logged $VenvPy $fetch) -ne 0) { Write-Log '(only GGUF export needs it; see the line above)' }

    Start-Step 'installing llama.cpp for Python (verifies GGUF exports)' ''
    $llamaNote = Install-LlamaCppPython
    if ($llamaNote) { Write-Log "llama-cpp-python: $llamaNote" }

    Start-Step 'creating shortcuts' "Check that the Desktop and Start menu are writable; the app also starts with $Prefix\TrainPilot.bat."
    Install-Launchers $src

    Start-Step 'checking the installation' 'PyTorch must import: run install.bat again to repair; the log above says what failed.'
    $stateArgs = @((Join-Path $RepoRoot 'installers\install_state.py'), '--prefix', $Prefix, '--venv-python', $VenvPy,
                   '--source', $src, '--decision', (Join-Path $Prefix 'torch-decision.json'))
    if ($NoDeepSpeed) { $stateArgs += '--skip-deepspeed' }
    if ($dsError) { $stateArgs += @('--deepspeed-install-error', $dsError) }
    $stateArgs += $extraArgs
    if ((Invoke-Logged $VenvPy $stateArgs) -ne 0) { Stop-Install 'PyTorch does not import in the new environment.' }
    $cli = Join-Path $Venv 'Scripts\trainpilot-cli.exe'
    if (Test-Path $cli) { Invoke-Logged $cli @('doctor') | Out-Null }

    Write-Log ''
    Write-Log "TrainPilot is installed in $Prefix."
    Write-Log 'Start it from the TrainPilot shortcut on the Desktop or in the Start menu.'
}

try {
    Invoke-Main
    exit 0
} catch {
    Stop-Install "$($_.Exception.Message)"
}
