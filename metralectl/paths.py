"""Where things live. The only module that reads the location environment variables.

Honours METRALECTL_CONFIG_DIR, METRALECTL_CACHE_DIR, METRALE_HOME, HF_HOME, HF_HUB_CACHE (and on Linux
XDG_CONFIG_HOME, XDG_CACHE_HOME); tests isolate these with fixtures.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
DATA_KINDS = ("engine", "kernels", "images", "recipes")


def data_root() -> Path:
    """The shipped data: inside the wheel (metralectl/_data), else the checkout's top level."""
    packaged = _PACKAGE_DIR / "_data"
    if (packaged / "recipes").is_dir():
        return packaged
    return _PACKAGE_DIR.parent


def config_dir() -> Path:
    """The user's config dir: recipes that extend or override shipped ones, identity, peers."""
    override = os.environ.get("METRALECTL_CONFIG_DIR")
    if override:
        return Path(override).expanduser()
    return _user_dir("XDG_CONFIG_HOME", "~/.config", "user_config_dir")


def user_data_dir(kind: str) -> Path:
    """A user overlay directory for one data kind (e.g. <config>/recipes)."""
    return config_dir() / kind


def cache_dir() -> Path:
    """Derived, disposable files (e.g. the parsed-catalog cache)."""
    override = os.environ.get("METRALECTL_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    return _user_dir("XDG_CACHE_HOME", "~/.cache", "user_cache_dir")


def _user_dir(variable: str, default: str, platformdirs_name: str) -> Path:
    """The user's config or cache dir for metralectl, as platformdirs gives it. On Linux that is the XDG Base
    Directory rule (the variable when it holds an absolute path, else the default under an absolute home),
    applied here: `list` and `ps` read both dirs, and importing platformdirs costs a tenth of their start
    (tests/unit/test_paths.py holds the two to each other). macOS and Windows ask platformdirs."""
    if sys.platform.startswith("linux"):
        value, home = os.environ.get(variable, ""), os.environ.get("HOME")
        if os.path.isabs(value):
            return Path(value) / "metralectl"
        if home is None or os.path.isabs(home):  # an empty or relative HOME: platformdirs decides
            return Path(os.path.expanduser(default)) / "metralectl"  # HOME, else the password database
    import platformdirs

    return Path(getattr(platformdirs, platformdirs_name)("metralectl", appauthor=False))


def hf_repo_folder(repo: str) -> str:
    """A repository's folder in the hub cache, `models--ORG--NAME`: one path component whatever the repo says
    ("/" becomes "--")."""
    return "models--" + repo.replace("/", "--")


def metrale_home() -> Path:
    """The benchmark store and run state (METRALE_HOME, default ~/.metrale)."""
    override = os.environ.get("METRALE_HOME")
    return Path(override).expanduser() if override else Path.home() / ".metrale"


def hf_home() -> Path:
    override = os.environ.get("HF_HOME")
    return Path(override).expanduser() if override else Path.home() / ".cache" / "huggingface"


def hf_hub_cache() -> Path:
    """The hub cache exactly as the engine resolves it: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub."""
    override = os.environ.get("HF_HUB_CACHE")
    return Path(override).expanduser() if override else hf_home() / "hub"


def display(path: Path) -> str:
    """A path as an operator would type it (~ for the home directory)."""
    home = str(Path.home())
    text = str(path)
    if text == home or text.startswith(home + os.sep):
        return "~" + text[len(home):]
    return text
