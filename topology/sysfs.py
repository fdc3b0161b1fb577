"""Reading a sysfs tree that may be the real ``/sys`` or a fixture directory.

Every file access of discovery goes through :class:`Sysfs`, which never raises: a missing or
unreadable file yields None, and when the caller says the file matters, a warning is recorded.
Discovery must never stand in the way of the TCP path, so a strange sysfs gives a smaller
topology and a list of warnings rather than an exception.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_HOST_BRIDGE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")
_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def pci_path_of(parts: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The PCI components of a resolved path: host bridge, then bridges, down to the device.

    Anything after the last PCI address (``virtio2/net/eth0``) is dropped, so a netdev and the
    PCI function it sits on share one path. ``()`` when the path is not under a host bridge.
    """
    for start, part in enumerate(parts):
        if _HOST_BRIDGE.match(part):
            path = [part]
            for child in parts[start + 1:]:
                if not _PCI_ADDRESS.match(child):
                    break
                path.append(child)
            return tuple(path) if len(path) > 1 else ()
    return ()


class Sysfs:
    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.warnings: list[str] = []

    def path(self, relative: str) -> Path:
        return self.root / relative

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def text(self, path: Path, required: bool = False) -> str | None:
        """A file's stripped content. Optional attributes (``speed`` of a down link, which the
        kernel answers with EINVAL) are silently None; required ones also leave a warning."""
        try:
            return path.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            if required:
                self.warn(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}")
            return None

    def number(self, path: Path, base: int = 10, required: bool = False) -> int | None:
        text = self.text(path, required)
        if text is None:
            return None
        try:
            return int(text, base)
        except ValueError:
            self.warn(f"unexpected content in {path}: {text!r}")
            return None

    def entries(self, path: Path, required: bool = False) -> list[str]:
        """Sorted names in a directory; [] when it is missing (a class this host lacks)."""
        try:
            return sorted(os.listdir(path))
        except OSError as exc:
            if required:
                self.warn(f"cannot list {path}: {exc.strerror}")
            return []

    def link_name(self, path: Path) -> str | None:
        """The last component a symlink points to (a driver's name), without resolving it."""
        try:
            return os.path.basename(os.readlink(path))
        except OSError:
            return None

    def resolved_parts(self, path: Path) -> tuple[str, ...]:
        """Components of ``path`` after following its links, relative to the tree's root."""
        try:
            real = Path(os.path.realpath(path, strict=True))
            return real.relative_to(os.path.realpath(self.root)).parts
        except (OSError, ValueError):
            return ()

    def pci_numa_node(self, pci_path: tuple[str, ...]) -> int | None:
        """The NUMA node sysfs reports for a PCI device; None for -1 (unknown) or no device."""
        if not pci_path:
            return None
        node = self.number(self.path("devices").joinpath(*pci_path, "numa_node"))
        return node if node is not None and node >= 0 else None
