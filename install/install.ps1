# metralectl installer for Windows (PowerShell 5.1+ or PowerShell 7).
#
# No release of metralectl (the distribution metralectl-cockpit) is published yet, so there is no
# address to download one from: give the installer a release directory, e.g. one built from a
# checkout (docs/install.md):
#
#   python scripts\release.py build --out dist\release\local
#   $env:METRALECTL_DOWNLOAD_URL = "$PWD\dist\release\local"; powershell -ExecutionPolicy Bypass -File install\install.ps1
#   powershell -ExecutionPolicy Bypass -File install\install.ps1 -Uninstall
#
# Without METRALECTL_DOWNLOAD_URL it stops, says so, and installs nothing. (The installer served on
# the Metrale engine team's site installs THEIR launcher, also named `metralectl`, not this one.)
#
# The same behaviour as install.sh, function for function: each function below names the install.sh
# function it mirrors ("mirrors install.sh: name"), and where Windows differs the comment says how.
# What it does:
#   1. downloads SHA256SUMS, the wheel and the windows-x86_64 dependency lock, and REFUSES to go on
#      unless each file's SHA-256 is listed in SHA256SUMS;
#   2. builds a new, private virtual environment under %LOCALAPPDATA%\metralectl\venvs, installs the
#      locked dependencies with `pip --require-hashes`, then the wheel;
#   3. puts metralectl.exe in ~\.local\bin by renaming (a running metralectl.exe can be renamed but
#      not overwritten: this is Windows' "text file busy");
#   4. adds that directory to the user's PATH once (or prints the line);
#   5. the background agent has no service manager here (no systemd): it says how to run it.
#   (install.sh's setup_completion has no counterpart: `metralectl completion` writes bash, zsh and
#   fish scripts (they set _METRALECTL_COMPLETE), not PowerShell's; METRALECTL_NO_COMPLETION is
#   accepted and changes nothing here. Nor do setup_man and uninstall_man: Windows has no man; the
#   wheel's man page stays in the venv, and `metralectl COMMAND --help` has the same text.)
#
# Options: -Uninstall -AllowRoot (run elevated anyway) -NoStart -NoModifyPath
# Environment: METRALECTL_DOWNLOAD_URL (required until a release is published), METRALECTL_INSTALL_DIR,
#   METRALECTL_PYTHON, METRALECTL_NO_MODIFY_PATH=1, METRALECTL_NO_AGENT=1, METRALECTL_NO_START=1,
#   and pip's own settings (PIP_INDEX_URL, PIP_FIND_LINKS, pip.ini) for where dependencies come from.
#
# Everything is in functions; the only statement at the top level is the last line. PowerShell parses
# a whole script (and `iex` a whole string) before running any of it, so a cut-short download fails
# to parse and runs nothing.

param(
    [switch]$Uninstall,
    [Alias('AllowAdmin')][switch]$AllowRoot,
    [switch]$NoStart,
    [switch]$NoModifyPath,
    [switch]$Help
)

# --- messages (mirrors install.sh: say, warn, die, usage) ----------------------------------------

function Say([string]$Text) { Write-Host $Text }   # mirrors install.sh: say

function Warn([string]$Text) { Write-Warning "metralectl installer: $Text" }   # mirrors install.sh: warn

# mirrors install.sh: die — throws; Main catches, cleans up, prints, and exits non-zero.
function Die([string]$Text) { throw [System.Exception]::new("metralectl installer: error: $Text") }

function Show-Usage {   # mirrors install.sh: usage
    Say "usage: install.ps1 [-Uninstall] [-AllowRoot] [-NoStart] [-NoModifyPath]"
    Say '  $env:METRALECTL_DOWNLOAD_URL = "RELEASE-DIRECTORY"; powershell -ExecutionPolicy Bypass -File install.ps1 [options]'
}

# --- arguments and refusals -----------------------------------------------------------------------

function Read-Options {   # mirrors install.sh: parse_args (switches come from the param block)
    $script:Mode = if ($Uninstall) { 'uninstall' } else { 'install' }
    $script:AllowRootOpt = [bool]$AllowRoot
    $script:NoStartOpt = [bool]$NoStart -or ($env:METRALECTL_NO_START -eq '1')
    $script:NoModifyPathOpt = [bool]$NoModifyPath -or ($env:METRALECTL_NO_MODIFY_PATH -eq '1')
    $script:NoAgentOpt = ($env:METRALECTL_NO_AGENT -eq '1')
}

# mirrors install.sh: refuse_root — elevated (Administrator) is Windows' root: the install would go
# to the admin's profile, models would run elevated, and the HF cache would become the admin's.
function Test-RefuseRoot {
    $principal = [Security.Principal.WindowsPrincipal][Security.Principal.WindowsIdentity]::GetCurrent()
    if (-not $principal.IsInRole([Security.Principal.WindowsBuiltInRole]::Administrator)) { return }
    if ($script:AllowRootOpt) {
        Warn "running elevated (-AllowRoot): installing into this account's profile ($HOME)"
        return
    }
    Die ("refusing to install from an elevated (Administrator) PowerShell: metralectl belongs to the " +
        "user who runs the models (elevated, models run elevated and the Hugging Face cache becomes " +
        "the administrator's). Open a normal PowerShell. To install elevated anyway: -AllowRoot")
}

# mirrors install.sh: expand_dir — '~' expanded, other relative paths refused.
function Expand-Dir([string]$Dir) {
    if ($Dir -eq '~') { return $HOME }
    if ($Dir -match '^~[\\/]') { return (Join-Path $HOME $Dir.Substring(2)) }
    if ($Dir.StartsWith('~')) { Die "cannot expand '$Dir' (only ~ and ~\... are understood): give an absolute path" }
    if (-not [System.IO.Path]::IsPathRooted($Dir)) { Die "'$Dir' is not an absolute path: give an absolute path (or one starting with ~\)" }
    return $Dir
}

# mirrors install.sh: set_paths — data in %LOCALAPPDATA%\metralectl (Windows' XDG_DATA_HOME).
function Set-Paths {
    $dir = if ($env:METRALECTL_INSTALL_DIR) { $env:METRALECTL_INSTALL_DIR } else { Join-Path $HOME '.local\bin' }
    $script:BinDir = (Expand-Dir $dir).TrimEnd('\', '/')
    $script:BinLink = Join-Path $script:BinDir 'metralectl.exe'
    $local = if ($env:LOCALAPPDATA) { $env:LOCALAPPDATA } else { Join-Path $HOME 'AppData\Local' }
    $script:DataDir = Join-Path $local 'metralectl'
    $script:Receipt = Join-Path $script:DataDir 'receipt'
}

# --- downloading and verifying --------------------------------------------------------------------

function Set-BaseUrl {   # mirrors install.sh: set_base_url
    if (-not $env:METRALECTL_DOWNLOAD_URL) { Stop-NoRelease }
    $url = $env:METRALECTL_DOWNLOAD_URL
    # A directory given as a path (a release built from a checkout) is read as file:///C:/...
    if ($url -notmatch '^[A-Za-z][A-Za-z0-9+.-]*://' -and [System.IO.Path]::IsPathRooted($url)) {
        $url = ([System.Uri]([System.IO.Path]::GetFullPath($url))).AbsoluteUri
    }
    $script:BaseUrl = $url.TrimEnd('/')
    Test-DownloadUrl $script:BaseUrl
}

# mirrors install.sh: refuse_no_release — no release is published yet, so there is no default address
# (the engine team's site serves THEIR launcher's installer, also named metralectl).
function Stop-NoRelease {
    Die ("no release of metralectl (metralectl-cockpit) is published yet, so there is nothing to download. " +
        "Install it from a checkout of its repository instead (docs/install.md), in the checkout's top directory: " +
        "'uv tool install .' or 'pipx install .'; or build a release there and install it with this script: " +
        "python scripts\release.py build --out dist\release\local, then " +
        '$env:METRALECTL_DOWNLOAD_URL = "$PWD\dist\release\local"; powershell -ExecutionPolicy Bypass -File install\install.ps1 ' +
        "(METRALECTL_DOWNLOAD_URL names the release directory: a path, file://, https://, or http:// to this machine)")
}

# mirrors install.sh: check_download_url, is_loopback_host, printable — the URL is parsed, not matched
# by prefix (a prefix test takes http://127.0.0.1:x@other/ for loopback; the download goes to 'other').
# Plain http lets anyone on the path replace the files and SHA256SUMS together: loopback hosts only.
function Test-DownloadUrl([string]$Url) {
    $show = $Url -replace '[^\x21-\x7e]', '?'
    if ($Url -cmatch '[^A-Za-z0-9._~:/!$&''()*+,;=%@\[\]-]') {
        Die "refusing to download from '$show': it has characters a release directory's URL does not need (a space, a control character, '\', '?', '#', a quote, '<', '>', ...); only https:// (or http:// to this machine)"
    }
    if ($Url.StartsWith('file://', [StringComparison]::Ordinal)) { return }
    if ($Url -cnotmatch '^(https?)://([^/]*)') {
        Die "refusing to download from '$show': only https:// (or http:// to this machine, or file://)"
    }
    $scheme = $Matches[1]
    $authority = $Matches[2]
    if ($authority.Contains('@')) {
        Die "refusing to download from '$show': it has user info ('...@') before the host. Everything before '@' is a user name and password, not the host: http://127.0.0.1:x@other/ downloads from 'other'. Give the host alone (only https://, or http:// to this machine)"
    }
    if ($authority -cnotmatch '^(\[[^\[\]]+\]|[^:\[\]]+)(:([0-9]{1,5}))?$') {
        Die "refusing to download from '$show': it names no host, or its port is not a number from 1 to 65535"
    }
    $hostName = $Matches[1]
    $port = $Matches[3]
    if ($port -and (([int]$port -lt 1) -or ([int]$port -gt 65535))) {
        Die "refusing to download from '$show': the port '$port' is not a number from 1 to 65535"
    }
    if ($scheme -ceq 'https') { return }
    if ($hostName -ceq 'localhost' -or $hostName -ceq '[::1]' -or
        $hostName -cmatch '^127(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$') { return }
    Die "refusing to download from '$show': only https:// (or http:// to this machine). Plain http:// to '$hostName' would let anyone on the network path replace the files and SHA256SUMS together. Plain http:// is accepted only to a loopback host: 127.0.0.0/8 written as four decimal numbers, [::1] or localhost. Use https:// (or file:// for a copied release directory)"
}

# mirrors install.sh: pick_downloader + download (+ wget_get) — Invoke-WebRequest fails on an HTTP error
# (a 404 page is an error, not a file); transient failures (no response, 5xx, 408, 429) are retried.
# A download that started on https:// and was redirected to anything else is refused (PowerShell 7.4+
# refuses such a redirect itself; Windows PowerShell 5.1 follows it, so the final address is checked).
function Get-Download([string]$Url, [string]$Dest) {
    if (Test-Path $Dest) { Remove-Item -Force $Dest }
    if ($Url.StartsWith('file://', [StringComparison]::Ordinal)) {
        # PowerShell 7's Invoke-WebRequest has no file:// (HttpClient); a local release is copied
        $local = ([System.Uri]$Url).LocalPath
        if (-not (Test-Path -LiteralPath $local -PathType Leaf)) { return $false }
        Copy-Item -LiteralPath $local -Destination $Dest
        return (Test-Path $Dest)
    }
    for ($try = 1; $try -le 4; $try++) {
        try {
            $response = Invoke-WebRequest -Uri $Url -OutFile $Dest -PassThru -UseBasicParsing -TimeoutSec 60
            $final = $null
            if ($response -and $response.BaseResponse) {
                $base = $response.BaseResponse
                if ($base.PSObject.Properties['ResponseUri']) { $final = $base.ResponseUri }           # 5.1
                elseif ($base.PSObject.Properties['RequestMessage']) { $final = $base.RequestMessage.RequestUri }   # 7
            }
            if ($Url.StartsWith('https://', [StringComparison]::Ordinal) -and $final -and $final.Scheme -ne 'https') {
                if (Test-Path $Dest) { Remove-Item -Force $Dest }
                Warn "$Url redirected to $final, which is not https://: not used"
                return $false
            }
            return (Test-Path $Dest)
        } catch {
            if (Test-Path $Dest) { Remove-Item -Force $Dest }
            $status = $null
            if ($_.Exception.Response) { $status = [int]$_.Exception.Response.StatusCode }
            $transient = ($null -eq $status) -or ($status -ge 500) -or ($status -in 408, 429)
            if (-not $transient -or $try -eq 4) { return $false }
            Start-Sleep -Seconds $try
        }
    }
    return $false
}

# mirrors install.sh: pick_hasher — fail closed when there is no way to compute SHA-256.
function Test-Hasher {
    if (-not (Get-Command Get-FileHash -ErrorAction SilentlyContinue)) {
        Die "no SHA-256 tool found (Get-FileHash): refusing to install files that cannot be verified"
    }
}

function Get-FileSha256([string]$Path) {   # mirrors install.sh: file_sha256
    return (Get-FileHash -Algorithm SHA256 -LiteralPath $Path).Hash.ToLowerInvariant()
}

# mirrors install.sh: sums_lookup — "<hex>  name", "<hex> *name", "./name", CRLF, upper-case hex;
# two different hashes for one name give nothing.
function Find-SumsEntry([string]$Name) {
    $found = $null
    foreach ($line in (Get-Content -LiteralPath (Join-Path $script:TmpDir 'SHA256SUMS'))) {
        $fields = $line.TrimEnd("`r") -split '\s+', 2
        if ($fields.Count -lt 2 -or $fields[0] -notmatch '^[0-9A-Fa-f]{64}$') { continue }
        $entry = $fields[1].Trim() -replace '^\*', '' -replace '^\./', ''
        if ($entry -ne $Name) { continue }
        $hash = $fields[0].ToLowerInvariant()
        if ($found -and $found -ne $hash) { return '' }
        $found = $hash
    }
    if ($found) { return $found } else { return '' }
}

function Find-SumsWheel {   # mirrors install.sh: sums_wheel_name
    $names = @{}
    foreach ($line in (Get-Content -LiteralPath (Join-Path $script:TmpDir 'SHA256SUMS'))) {
        $fields = $line.TrimEnd("`r") -split '\s+', 2
        if ($fields.Count -lt 2 -or $fields[0].Length -ne 64) { continue }
        $entry = $fields[1].Trim() -replace '^\*', '' -replace '^\./', ''
        if ($entry -match '^metralectl_cockpit-[0-9][^-]*-py3-none-any\.whl$') { $names[$entry] = $true }
    }
    if ($names.Count -eq 1) { return @($names.Keys)[0] } else { return '' }
}

function Get-Verified([string]$Name) {   # mirrors install.sh: fetch_verified
    Say "  downloading $Name"
    $dest = Join-Path $script:TmpDir $Name
    if (-not (Get-Download "$($script:BaseUrl)/$Name" $dest)) { Die "could not download $($script:BaseUrl)/$Name" }
    $want = Find-SumsEntry $Name
    if (-not $want) { Die "SHA256SUMS has no (or no unambiguous) entry for ${Name}: refusing to install it" }
    $got = Get-FileSha256 $dest
    if ($got -ne $want) {
        Die ("SHA-256 mismatch for ${Name}: SHA256SUMS says $want, the download is $got " +
            "(a corrupted or tampered download, or an error page served in its place)")
    }
}

# --- Python ---------------------------------------------------------------------------------------

# mirrors install.sh: pick_python + try_python — the `py` launcher first (python.exe may be the Microsoft Store
# stub, which fails the version probe and is skipped).
function Select-Python {
    $candidates = if ($env:METRALECTL_PYTHON) { @(, @($env:METRALECTL_PYTHON)) }
                  else { @(@('py', '-3'), @('python3'), @('python')) }
    $skipped = @()
    foreach ($cand in $candidates) {
        if (-not (Get-Command $cand[0] -ErrorAction SilentlyContinue)) { continue }
        $extra = @($cand | Select-Object -Skip 1)
        try { $ver = & $cand[0] @extra -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>$null } catch { continue }
        if ($LASTEXITCODE -ne 0 -or -not $ver) { continue }
        & $cand[0] @extra -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>$null
        if ($LASTEXITCODE -eq 0) {
            # The interpreter's own path: what the venv is made from.
            $script:Python = (& $cand[0] @extra -c 'import sys; print(sys.executable)').Trim()
            $script:PyVersion = "$ver".Trim()
            return
        }
        $skipped += "$($cand -join ' ') ($ver)"
    }
    Die "metralectl needs Python 3.10 or newer; found $(if ($skipped) { $skipped -join ', ' } else { 'none' }). Install it from python.org (or: winget install Python.Python.3.12), or set METRALECTL_PYTHON"
}

function Get-PlatformName {   # mirrors install.sh: detect_platform
    $info = (& $script:Python -c 'import platform, sys; print(sys.platform, platform.machine().lower())').Trim() -split ' '
    if ($info[0] -ne 'win32') { Die "this is not Windows ($($info[0])): use install.sh" }
    if ($info[1] -notin 'amd64', 'x86_64') { Die "unsupported processor '$($info[1])' (windows-x86_64 is released)" }
    $script:Platform = 'windows-x86_64'
}

function Test-VenvModule {   # mirrors install.sh: check_venv_module
    & $script:Python -c 'import venv, ensurepip' 2>$null
    if ($LASTEXITCODE -ne 0) { Die "$($script:Python) ($($script:PyVersion)) cannot create virtual environments (no venv/ensurepip): reinstall Python from python.org" }
}

function Test-LockPython {   # mirrors install.sh: check_lock_python
    $header = Get-Content -LiteralPath (Join-Path $script:TmpDir $script:Lock) | Where-Object { $_ -like '# python: *' } | Select-Object -First 1
    $list = ($header -replace '^# python: ', '').Trim() -split '\s+'
    if ($script:PyVersion -notin $list) {
        Die "$($script:Python) is Python $($script:PyVersion); this release has dependency wheels for Python $($list -join ' ') only (set METRALECTL_PYTHON)"
    }
}

# --- install --------------------------------------------------------------------------------------

# mirrors install.sh: check_bin_link_free — ours when the receipt names it (no symlinks here).
function Test-BinLinkFree {
    if (-not (Test-Path -LiteralPath $script:BinLink)) { return }
    if ((Get-ReceiptValues 'bin') -contains $script:BinLink) { return }
    Die "$($script:BinLink) already exists and was not installed by this installer (pip install --user?): remove it first, or set METRALECTL_INSTALL_DIR"
}

# mirrors install.sh: venv_pip (+ pip_failed) — pip with settings that break a venv install cleared.
function Invoke-VenvPip([string[]]$PipArgs) {
    $saved = @{}
    foreach ($name in 'PIP_USER', 'PIP_TARGET', 'PIP_PREFIX', 'PIP_REQUIRE_VIRTUALENV', 'PYTHONPATH', 'PYTHONHOME') {
        $saved[$name] = [Environment]::GetEnvironmentVariable($name, 'Process')
        [Environment]::SetEnvironmentVariable($name, $null, 'Process')
    }
    try {
        $py = Join-Path $script:Stage 'Scripts\python.exe'
        & $py -m pip --disable-pip-version-check --no-input --no-cache-dir @PipArgs *>> (Join-Path $script:TmpDir 'pip.log')
        return ($LASTEXITCODE -eq 0)
    } finally {
        foreach ($name in $saved.Keys) { [Environment]::SetEnvironmentVariable($name, $saved[$name], 'Process') }
    }
}

function Stop-PipFailed([string]$Text) {   # mirrors install.sh: pip_failed
    Get-Content -LiteralPath (Join-Path $script:TmpDir 'pip.log') -Tail 25 | ForEach-Object { [Console]::Error.WriteLine($_) }
    Die $Text
}

# mirrors install.sh: first_missing_dir
function Get-FirstMissingDir([string]$Dir) {
    $top = ''
    while ($Dir -and -not (Test-Path -LiteralPath $Dir)) { $top = $Dir; $Dir = Split-Path -Parent $Dir }
    return $top
}

# mirrors install.sh: install_stage — a new venvs\<version>-<time>-<pid> each time.
function Install-Stage {
    $script:CreatedTop = Get-FirstMissingDir (Join-Path $script:DataDir 'venvs')
    New-Item -ItemType Directory -Force -Path (Join-Path $script:DataDir 'venvs') | Out-Null
    $script:Generation = "$($script:Version)-$(Get-Date -Format yyyyMMddHHmmss)-$PID"
    $script:Stage = Join-Path $script:DataDir "venvs\$($script:Generation)"
    Say "  creating $($script:Stage) (Python $($script:PyVersion))"
    & $script:Python -m venv $script:Stage *>> (Join-Path $script:TmpDir 'pip.log')
    if ($LASTEXITCODE -ne 0) { Stop-PipFailed "could not create a virtual environment with $($script:Python)" }
    Say "  installing the locked dependencies (hash-checked)"
    if (-not (Invoke-VenvPip @('install', '--require-hashes', '--only-binary', ':all:', '-r', (Join-Path $script:TmpDir $script:Lock)))) {
        Stop-PipFailed "pip could not install the locked dependencies (see above)"
    }
    Say "  installing $($script:Wheel)"
    if (-not (Invoke-VenvPip @('install', '--no-deps', '--no-index', (Join-Path $script:TmpDir $script:Wheel)))) {
        Stop-PipFailed "pip could not install $($script:Wheel)"
    }
    if (-not (Invoke-VenvPip @('check'))) { Stop-PipFailed "the installed dependencies do not satisfy metralectl's requirements" }
    $out = & (Join-Path $script:Stage 'Scripts\metralectl.exe') --version 2>&1
    if ($LASTEXITCODE -ne 0) { Die "the new metralectl does not start: $out" }
    if ("$out" -notlike "*$($script:Version)*") { Die "the new metralectl reports '$out', expected $($script:Version)" }
}

# mirrors install.sh: replace_link — Windows has no cheap symlinks, so the launcher .exe is copied
# next to the old one and renamed into place; the old one (maybe running: it can be renamed, not
# overwritten) is renamed aside first and deleted when no longer in use.
function Set-Launcher([string]$Source, [string]$Dest) {
    $new = "$Dest.new"
    Copy-Item -LiteralPath $Source -Destination $new -Force
    if (Test-Path -LiteralPath $Dest) {
        $aside = "$Dest.old-$PID"
        Move-Item -LiteralPath $Dest -Destination $aside -Force
        Remove-Item -LiteralPath $aside -Force -ErrorAction SilentlyContinue   # fails while running: left for next time
    }
    Move-Item -LiteralPath $new -Destination $Dest -Force
    Get-ChildItem -LiteralPath (Split-Path -Parent $Dest) -Filter 'metralectl.exe.old-*' -ErrorAction SilentlyContinue |
        Remove-Item -Force -ErrorAction SilentlyContinue
}

function Get-ReceiptValues([string]$Key) {   # mirrors install.sh: receipt_values
    if (-not (Test-Path -LiteralPath $script:Receipt)) { return @() }
    return @(Get-Content -LiteralPath $script:Receipt | Where-Object { $_ -like "$Key=*" } | ForEach-Object { $_.Substring($Key.Length + 1) })
}

function Add-ReceiptValue([string]$Key, [string]$Value) {   # mirrors install.sh: receipt_add
    if ((Get-ReceiptValues $Key) -notcontains $Value) { Add-Content -LiteralPath $script:Receipt -Value "$Key=$Value" }
}

# mirrors install.sh: install_commit — the receipt's venv= line is the switch (no `venv` symlink).
function Complete-Install {
    New-Item -ItemType Directory -Force -Path $script:BinDir | Out-Null
    $oldBin = Get-ReceiptValues 'bin' | Select-Object -First 1
    $lines = @('# metralectl installer receipt: what -Uninstall removes', "version=$($script:Version)",
               "venv=$($script:Stage)", "bin=$($script:BinLink)")
    $lines += Get-ReceiptValues 'userpath' | ForEach-Object { "userpath=$_" }
    Set-Content -LiteralPath "$($script:Receipt).new" -Value $lines
    Move-Item -LiteralPath "$($script:Receipt).new" -Destination $script:Receipt -Force
    $script:Committed = $true
    Set-Launcher (Join-Path $script:Stage 'Scripts\metralectl.exe') $script:BinLink
    if ($oldBin -and $oldBin -ne $script:BinLink -and (Test-Path -LiteralPath $oldBin)) {
        Remove-Item -LiteralPath $oldBin -Force -ErrorAction SilentlyContinue
    }
    Remove-OldGenerations
}

function Remove-OldGenerations {   # mirrors install.sh: prune_generations
    foreach ($dir in Get-ChildItem -LiteralPath (Join-Path $script:DataDir 'venvs') -Directory) {
        if ($dir.FullName -eq $script:Stage -or $dir.FullName -eq $script:PreviousVenv) { continue }
        Remove-Item -LiteralPath $dir.FullName -Recurse -Force -ErrorAction SilentlyContinue
    }
}

# --- PATH -----------------------------------------------------------------------------------------

function Test-OnPath([string]$Dir) {   # mirrors install.sh: on_path (trailing \ or / ignored)
    foreach ($entry in ($env:Path -split ';')) {
        if ($entry.TrimEnd('\', '/') -ieq $Dir) { return $true }
    }
    return $false
}

# mirrors install.sh: setup_path (+ path_line_for_shell) — the user's PATH lives in the registry
# (HKCU\Environment), not in a profile file; added once, never twice.
function Set-UserPath {
    if (Test-OnPath $script:BinDir) { return }
    $nowLine = "`$env:Path = `"`$env:Path;$($script:BinDir)`""
    if ($script:NoModifyPathOpt) {
        Say ""
        Say "$($script:BinDir) is not on your PATH. Add it to your user PATH (Settings > Environment Variables),"
        Say "or for this PowerShell only run:"
        Say ""
        Say "    $nowLine"
        return
    }
    $userPath = [Environment]::GetEnvironmentVariable('Path', 'User')
    $entries = @(if ($userPath) { $userPath -split ';' | Where-Object { $_ } })
    if ($entries | Where-Object { $_.TrimEnd('\', '/') -ieq $script:BinDir }) {
        Say ""
        Say "Your user PATH already has $($script:BinDir) (new terminals). For this one, run:"
    } else {
        [Environment]::SetEnvironmentVariable('Path', (($entries + $script:BinDir) -join ';'), 'User')
        Add-ReceiptValue 'userpath' $script:BinDir
        Say ""
        Say "Added $($script:BinDir) to your user PATH (new terminals). For this one, run:"
    }
    Say ""
    Say "    $nowLine"
}

# --- the background agent -------------------------------------------------------------------------

# mirrors install.sh: setup_agent — no systemd on Windows (write_unit, explain_no_user_manager,
# suggest_linger and check_docker_group have no counterpart): say so, as install.sh does on macOS.
function Set-Agent {
    Say ""
    if ($script:NoAgentOpt) { Say "Background agent: skipped (METRALECTL_NO_AGENT=1)."; return }
    Say "Background agent: not set up on Windows (systemd only); run 'metralectl agent' when needed."
}

# --- uninstall ------------------------------------------------------------------------------------

# mirrors install.sh: uninstall (+ remove_path_lines) — the environments, the launcher, the receipt
# and the PATH entry we added; metralectl's config, the HF cache and ~\.metrale stay.
function Invoke-Uninstall {
    Say "Uninstalling metralectl"
    $bins = @(Get-ReceiptValues 'bin')
    foreach ($bin in $bins) {
        if (Test-Path -LiteralPath $bin) {
            $aside = "$bin.old-$PID"
            Move-Item -LiteralPath $bin -Destination $aside -Force
            Remove-Item -LiteralPath $aside -Force -ErrorAction SilentlyContinue
            Say "  removed $bin"
        }
    }
    if (-not $bins -and (Test-Path -LiteralPath $script:BinLink)) { Say "  kept $($script:BinLink) (not installed by this installer)" }
    foreach ($dir in Get-ReceiptValues 'userpath') {
        $userPath = [Environment]::GetEnvironmentVariable('Path', 'User')
        $kept = @($userPath -split ';' | Where-Object { $_ -and $_.TrimEnd('\', '/') -ine $dir })
        [Environment]::SetEnvironmentVariable('Path', ($kept -join ';'), 'User')
        Say "  removed $dir from your user PATH"
    }
    if ((Test-Path -LiteralPath (Join-Path $script:DataDir 'venvs')) -or (Test-Path -LiteralPath $script:Receipt)) {
        Remove-Item -LiteralPath (Join-Path $script:DataDir 'venvs') -Recurse -Force -ErrorAction SilentlyContinue
        Remove-Item -LiteralPath $script:Receipt, "$($script:Receipt).new" -Force -ErrorAction SilentlyContinue
        if (-not (Get-ChildItem -LiteralPath $script:DataDir -Force)) { Remove-Item -LiteralPath $script:DataDir -Force }
        Say "  removed the environments in $($script:DataDir)"
    } else {
        Say "  no installation found in $($script:DataDir)"
    }
    $config = if ($env:METRALECTL_CONFIG_DIR) { $env:METRALECTL_CONFIG_DIR } else { "metralectl's config dir" }
    Say "Kept your data: $config, the Hugging Face cache, ~\.metrale."
}

# --- main -----------------------------------------------------------------------------------------

function Clear-Install {   # mirrors install.sh: cleanup
    if (-not $script:Committed) {
        if ($script:Stage -and (Test-Path -LiteralPath $script:Stage)) { Remove-Item -LiteralPath $script:Stage -Recurse -Force -ErrorAction SilentlyContinue }
        if ($script:CreatedTop) { Remove-Item -LiteralPath $script:CreatedTop -Recurse -Force -ErrorAction SilentlyContinue }
    }
    if ($script:TmpDir -and (Test-Path -LiteralPath $script:TmpDir)) { Remove-Item -LiteralPath $script:TmpDir -Recurse -Force -ErrorAction SilentlyContinue }
}

function Install-Metralectl {   # mirrors install.sh: install
    Say "Installing metralectl"
    Set-BaseUrl
    Test-Hasher
    Select-Python
    Get-PlatformName
    Test-VenvModule
    Test-BinLinkFree
    $script:TmpDir = Join-Path ([System.IO.Path]::GetTempPath()) "metralectl-install.$PID.$(Get-Random)"
    New-Item -ItemType Directory -Path $script:TmpDir | Out-Null
    Say "  from $($script:BaseUrl) ($($script:Platform))"
    Say "  downloading SHA256SUMS"
    if (-not (Get-Download "$($script:BaseUrl)/SHA256SUMS" (Join-Path $script:TmpDir 'SHA256SUMS'))) {
        Die "could not download $($script:BaseUrl)/SHA256SUMS: refusing to install anything unverified"
    }
    $script:Wheel = Find-SumsWheel
    if (-not $script:Wheel) { Die "SHA256SUMS lists no single metralectl wheel: not a metralectl release" }
    $script:Version = ($script:Wheel -replace '^metralectl_cockpit-', '') -replace '-.*$', ''
    $script:Lock = "metralectl-$($script:Version)-$($script:Platform).lock.txt"
    Get-Verified $script:Wheel
    Get-Verified $script:Lock
    Test-LockPython
    $script:PreviousVenv = Get-ReceiptValues 'venv' | Select-Object -First 1
    Install-Stage
    Complete-Install
    Say "metralectl $($script:Version) installed: $($script:BinLink)"
    Set-UserPath
    Set-Agent
    Say ""
    Say "Done. Try:  metralectl list"
}

# mirrors install.sh: main (need_cmd has no counterpart: everything used here is built into
# PowerShell, and Test-Hasher covers the one tool that could be missing).
function Main {
    if ($Help) { Show-Usage; return }
    $script:Committed = $false
    $script:Stage = ''
    $script:CreatedTop = ''
    $script:TmpDir = ''
    [Net.ServicePointManager]::SecurityProtocol = [Net.ServicePointManager]::SecurityProtocol -bor [Net.SecurityProtocolType]::Tls12
    $code = 0
    try {
        Read-Options
        Test-RefuseRoot
        Set-Paths
        if ($script:Mode -eq 'uninstall') { Invoke-Uninstall } else { Install-Metralectl }
    } catch {
        [Console]::Error.WriteLine($_.Exception.Message)
        if ($script:Committed) { [Console]::Error.WriteLine('metralectl installer: the new version is installed; only the step above failed.') }
        else { [Console]::Error.WriteLine('metralectl installer: nothing was installed or changed.') }
        $code = 1
    } finally {
        Clear-Install
    }
    # `exit` would close the user's window under `irm | iex`; a script file run with -File still
    # gets the code through $LASTEXITCODE.
    $global:LASTEXITCODE = $code
    if ($code -ne 0 -and $MyInvocation.ScriptName) { exit $code }
}

& { Main }
