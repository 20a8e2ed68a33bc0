"""install.sh's man page step: the wheel's page (share/man/man1 in the venv) copied into the user's man path,
found there by `man` by name, taken back by --uninstall with the directories it made; someone else's page
is left alone. (The full install from a real wheel: test_install_sh.py.)"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.installer.test_functions import sh  # noqa: F401  (the fixture)
from tests.unit.recipe_helpers import REPO

PAGE = REPO / "docs" / "metralectl.1"
STEP = 'VERSION=9.9; RECEIPT="$HOME/receipt"; : >"$RECEIPT"; STAGE="$HOME/stage"; setup_man'


def stage(sh) -> None:  # noqa: F811
    man1 = sh.home / "stage" / "share" / "man" / "man1"
    man1.mkdir(parents=True)
    shutil.copyfile(PAGE, man1 / "metralectl.1")


def test_the_page_goes_into_the_users_man_path_and_uninstall_takes_it_back(sh) -> None:  # noqa: F811
    stage(sh)
    (sh.home / ".local/share").mkdir(parents=True)
    (sh.home / ".local/bin").mkdir()
    done = sh(STEP)
    assert done.returncode == 0, done.stderr
    installed = sh.home / ".local/share/man/man1/metralectl.1"
    assert installed.read_bytes() == PAGE.read_bytes()
    assert f"Man page: {installed} (man metralectl)." in done.stdout
    receipt = (sh.home / "receipt").read_text()
    assert f"man={installed}\n" in receipt and f"man_dir={sh.home}/.local/share/man\n" in receipt
    if shutil.which("man"):  # man-db finds ~/.local/share/man through ~/.local/bin on PATH, by name
        found = subprocess.run(["man", "-w", "metralectl"], capture_output=True, text=True, timeout=60,
                               env={"HOME": str(sh.home), "PATH": f"{sh.home}/.local/bin:/usr/bin:/bin"})
        assert found.stdout.strip() == str(installed), found.stdout + found.stderr
    gone = sh('RECEIPT="$HOME/receipt"; uninstall')
    assert gone.returncode == 0, gone.stderr
    assert f"removed {installed}" in gone.stdout
    assert not (sh.home / ".local/share/man").exists() and (sh.home / ".local/share").is_dir()


def test_someone_elses_page_is_kept(sh) -> None:  # noqa: F811
    stage(sh)
    theirs = sh.home / ".local/share/man/man1/metralectl.1"
    theirs.parent.mkdir(parents=True)
    theirs.write_text(".TH OTHER 1\n")
    done = sh(STEP)
    assert done.returncode == 0 and "kept" in done.stdout, done.stdout + done.stderr
    assert theirs.read_text() == ".TH OTHER 1\n" and "man=" not in (sh.home / "receipt").read_text()
    (sh.home / "receipt").write_text(f"man={theirs}\n")  # even named in a receipt, it is not ours
    sh('RECEIPT="$HOME/receipt"; uninstall')
    assert theirs.read_text() == ".TH OTHER 1\n"


def test_a_release_without_a_page_installs_without_one(sh) -> None:  # noqa: F811
    (sh.home / "stage").mkdir()
    done = sh(STEP)
    assert done.returncode == 0 and "carries no man page" in done.stderr
    assert not (sh.home / ".local/share/man").exists()


def test_a_link_there_is_left_alone(sh) -> None:  # noqa: F811
    stage(sh)
    link = sh.home / ".local/share/man/man1/metralectl.1"
    link.parent.mkdir(parents=True)
    link.symlink_to(PAGE)  # e.g. pipx's, to its own venv
    assert sh(STEP).returncode == 0
    assert link.is_symlink() and Path(link.readlink()) == PAGE
