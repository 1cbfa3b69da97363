"""Whom a store trusts, said at run time: once per store, when a process first uses it.

Entries are pickles: whoever can write a store without ``STABLEGUARDS_STORE_KEY`` runs code in
every process that reads it.  That is fine for a directory only this user writes under their
own cache dir (the default), and worth one warning otherwise:

* a shared store without a key: Redis, or a directory named by ``STABLEGUARDS_STORE`` outside
  the user's inductor cache dir (``TORCHINDUCTOR_CACHE_DIR``, else torch's default,
  ``<tmp>/torchinductor_<user>``);
* a store directory other users can write (the directory or a folder in it writable by all,
  or by a group with other members; or a folder above it that others can rename it in): with
  a key they cannot forge entries, but they can remove or withhold them.
"""

from __future__ import annotations

import functools
import getpass
import grp
import os
import pwd
import re
import stat
import tempfile
from pathlib import Path

from stableguards.storage import messages


def check(store: str, directory: Path | None, named: bool, signed: bool) -> None:
    """Warn once about ``store`` (Redis, or ``directory``; ``named`` by ``STABLEGUARDS_STORE``)
    if others may write it (see the module docstring)."""
    if directory is None:
        if not signed:
            messages.warn_untrusted(store, "a shared Redis store without STABLEGUARDS_STORE_KEY: whoever can "
                                              "write it runs code in this process; set the same key on every "
                                              "process that uses it")
        return
    if named and not signed and not _under(directory, _own_cache_dir()):
        messages.warn_untrusted(str(directory), "a shared store without STABLEGUARDS_STORE_KEY: whoever can write "
                                                "it runs code in this process; set the same key on every process "
                                                "that uses it")
    if (writable := writable_by_others(directory)) is not None:
        consequence = ("they can remove or withhold entries (not forge them: they are signed)" if signed else
                       "they can run code in this process")
        messages.warn_untrusted(str(directory), f"{writable} can be written by other users: {consequence}; make it "
                                                f"writable by this user only (chmod go-w)")


def writable_by_others(directory: Path) -> Path | None:
    """The first of ``directory``, its folders and the folders above it that lets another user
    change what the store holds, or None.  Above the store, a sticky folder (``/tmp``) is safe:
    others cannot rename what is in it."""
    try:
        inside = [directory, *(p for p in directory.iterdir() if p.is_dir() and not p.is_symlink())]
        for path in inside:
            if _others_can_write(path.stat()):
                return path
        for path in directory.resolve().parents:
            info = path.stat()
            if _others_can_write(info) and not info.st_mode & stat.S_ISVTX:
                return path
    except OSError:
        return None  # not made yet, or not ours to read: nothing to say
    return None


def _others_can_write(info: os.stat_result) -> bool:
    if info.st_mode & stat.S_IWOTH:
        return True
    return bool(info.st_mode & stat.S_IWGRP) and _group_has_others(info.st_gid, info.st_uid)


@functools.lru_cache(maxsize=32)
def _group_has_others(gid: int, owner: int) -> bool:
    """Whether a user other than ``owner`` is in group ``gid`` (by membership or as their
    primary group).  A user's private group is not shared."""
    try:
        name = pwd.getpwuid(owner).pw_name
        members = set(grp.getgrgid(gid).gr_mem) - {name}
        return bool(members) or any(u.pw_gid == gid and u.pw_uid != owner for u in pwd.getpwall())
    except KeyError:  # a group or owner this machine does not name: assume shared
        return True


def _own_cache_dir() -> Path:
    """inductor's cache dir, as torch makes it (``cache_dir_utils.default_cache_dir``)."""
    named = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if named:
        return Path(named)
    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except (KeyError, OSError):
        user = f"uid_{os.getuid()}"
    return Path(tempfile.gettempdir()) / f"torchinductor_{user}"


def _under(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False
