"""Where things live. The only module that reads the location environment variables.

Honours METRALECTL_CONFIG_DIR, METRALE_HOME, HF_HOME, HF_HUB_CACHE; tests isolate these with
fixtures.
"""

from __future__ import annotations

import os
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
    from platformdirs import user_config_dir

    return Path(user_config_dir("metralectl", appauthor=False))


def user_data_dir(kind: str) -> Path:
    """A user overlay directory for one data kind (e.g. <config>/recipes)."""
    return config_dir() / kind


def cache_dir() -> Path:
    """Derived, disposable files (e.g. the parsed-catalog cache)."""
    override = os.environ.get("METRALECTL_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("metralectl", appauthor=False))


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
