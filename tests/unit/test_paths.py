"""paths.config_dir and paths.cache_dir without METRALECTL_CONFIG_DIR / METRALECTL_CACHE_DIR: on Linux they apply
the XDG rule themselves (no platformdirs import on `list`'s start), and say what platformdirs says."""

from __future__ import annotations

import sys
from pathlib import Path

import platformdirs
import pytest

from metralectl import paths

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the XDG rule is applied on Linux only")

HOMES = {"absolute": "/home/op", "unset": None, "empty": "", "relative": "op", "root": "/"}
XDG = {"unset": None, "absolute": "/srv/xdg", "trailing slash": "/srv/xdg/", "empty": "", "relative": "xdg",
       "blank": "  "}


@pytest.mark.parametrize("home", list(HOMES))
@pytest.mark.parametrize("xdg", list(XDG))
def test_config_and_cache_dirs_are_platformdirs_own(home: str, xdg: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("METRALECTL_CONFIG_DIR")
    monkeypatch.delenv("METRALECTL_CACHE_DIR")
    for name, value in (("HOME", HOMES[home]), ("XDG_CONFIG_HOME", XDG[xdg]), ("XDG_CACHE_HOME", XDG[xdg])):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    try:
        expected = (Path(platformdirs.user_config_dir("metralectl", appauthor=False)),
                    Path(platformdirs.user_cache_dir("metralectl", appauthor=False)))
    except RuntimeError:  # no home platformdirs can resolve: paths lets it say so
        with pytest.raises(RuntimeError):
            paths.config_dir()
        return
    assert (paths.config_dir(), paths.cache_dir()) == expected


def test_the_overrides_win(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", "/srv/xdg")
    monkeypatch.setenv("XDG_CACHE_HOME", "/srv/xdg")
    assert (paths.config_dir(), paths.cache_dir()) == (isolated_env / "config", isolated_env / "cache")
