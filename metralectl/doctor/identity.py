"""Who runs doctor, as the kernel and /etc/group see it: ids, groups, the docker group, and whoever ran sudo.

The host checks judge these (docker group membership, a shell started before `usermod -aG`, root);
`current_identity` reads them once per run, and tests pass an `Identity` of their own.
"""

from __future__ import annotations

import grp
import os
import pwd
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Identity:
    """Who runs doctor, as the kernel and /etc/group see it."""

    uid: int
    euid: int
    gid: int
    user: str
    group: str  # primary group's name
    home: Path
    groups: tuple[int, ...]  # os.getgroups(): the groups this process really has
    docker_gid: int | None  # None: no docker group on this machine
    docker_listed: bool  # /etc/group names us in the docker group (or it is our primary group)
    sudo_user: str | None = None
    sudo_uid: int | None = None
    sudo_gid: int | None = None
    sudo_home: Path | None = None
    sudo_group: str | None = None  # the invoking user's primary group's name

    @property
    def root(self) -> bool:
        return self.euid == 0

    @property
    def docker_active(self) -> bool:
        """This process carries the docker group (a shell started before `usermod -aG` does not)."""
        return self.docker_gid is not None and (self.docker_gid in self.groups or self.gid == self.docker_gid)


def current_identity(environ: Mapping[str, str] | None = None) -> Identity:
    env = os.environ if environ is None else environ
    uid, euid, gid = os.getuid(), os.geteuid(), os.getgid()
    try:
        entry = pwd.getpwuid(uid)
        user, home = entry.pw_name, Path(entry.pw_dir)
    except KeyError:
        user, home = str(uid), Path.home()
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    try:
        docker = grp.getgrnam("docker")
        docker_gid: int | None = docker.gr_gid
        listed = user in docker.gr_mem or gid == docker.gr_gid
    except KeyError:
        docker_gid, listed = None, False
    sudo_user = env.get("SUDO_USER") or None
    sudo_uid = _int(env.get("SUDO_UID"))
    sudo_gid = _int(env.get("SUDO_GID"))
    sudo_home, sudo_group = None, None
    if sudo_user:
        try:
            sudo_entry = pwd.getpwnam(sudo_user)
            sudo_home = Path(sudo_entry.pw_dir)
            sudo_uid = sudo_uid if sudo_uid is not None else sudo_entry.pw_uid
            sudo_gid = sudo_gid if sudo_gid is not None else sudo_entry.pw_gid
        except KeyError:
            pass
        try:
            sudo_group = grp.getgrgid(sudo_gid).gr_name if sudo_gid is not None else None
        except KeyError:
            sudo_group = str(sudo_gid)
    return Identity(uid, euid, gid, user, group, home, tuple(os.getgroups()), docker_gid, listed,
                    sudo_user, sudo_uid, sudo_gid, sudo_home, sudo_group)


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None
