"""Draining a segment: move the objects held only there to other segments, then let it leave.

``state`` is the master's half (pure, mixed into :class:`store.master_state.MasterState`),
``messages`` the drain ops' answers on the wire, ``drainer`` the loop a library client runs to
move the bytes (what `mooncake drain` calls).
"""
