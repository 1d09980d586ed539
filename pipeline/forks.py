"""What a forked child must not inherit: a lock another thread of the parent held, a group
that thread led, a descriptor the parent locks through. Objects that hold such state ask for
:func:`reset_in_child`; one fork hook resets every one still alive.

One hook for all, not one each: ``os.register_at_fork`` never forgets a hook, so a hook per
object stays registered for the life of the process — about 1 KB kept for every object a
caller makes and drops (the library's ``journal.flush`` makes lock files per call)."""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class ResetInChild(Protocol):
    """An object with state a forked child must make afresh."""

    def after_fork_in_child(self) -> None:
        """Make that state afresh (called in the child, in its only thread)."""
        ...


_LIVE: weakref.WeakSet[ResetInChild] = weakref.WeakSet()


def reset_in_child(obj: ResetInChild) -> None:
    """Call ``obj.after_fork_in_child()`` in every child forked while ``obj`` is alive."""
    _LIVE.add(obj)


def _after_fork_in_child() -> None:
    for obj in list(_LIVE):
        obj.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
