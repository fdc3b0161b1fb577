"""Put reservations: a small put in one master round trip instead of two.

A plain put asks the master for a range (PutStart), writes its bytes there, and tells the master
they are in place (PutEnd): two round trips, which for a 4 KiB object are most of its time. With
a reservation the master grants the client a range ahead of time, with no key; the client writes
its next small objects into it and commits them in one call, whose answer carries the range for
the put after it. An object is still published only once its bytes are in place, with the
checksum the writer took, and a reservation is never visible to readers.

``state`` is the master's half (pure, mixed into :class:`store.master_state.MasterState`),
``messages`` the grant as both ends see it, ``holder`` the store client's side: which grant a
put may use, and for how long.
"""
