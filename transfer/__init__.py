"""The transfer engine, its transports and the control-plane RPC every daemon speaks.

The ground floor, which imports nothing else of this project and which every room may import:
:mod:`transfer.errors` (the root :class:`~transfer.errors.MooncakeError` of every typed error,
and the wire form errors travel in) and :mod:`transfer.settings` (the one registry of settings).

At the root sit the engine (:mod:`transfer.engine`, :mod:`transfer.engine_options`, and
:mod:`transfer.from_settings`, which builds one from the settings), the state of transfers in
flight (:mod:`transfer.batch`, :mod:`transfer.batches`), registered memory
(:mod:`transfer.memory`), segment descriptors (:mod:`transfer.descriptor`), NIC path selection
(:mod:`transfer.path_selection`), the SIEVE cache of endpoints (:mod:`transfer.sieve`), the
interface every transport implements (:mod:`transfer.transport`) and the bench. One folder per
concern below it: the transports ``tcp/``, ``rdma/`` (with the verbs seam and its pyverbs
adapter) and ``shm/``; ``gpu/`` (device memory); ``metadata/`` (where segment descriptors are
published and found: the master, HTTP, etcd); ``rpc/`` (the control plane); ``etcd/`` (the etcd
key-value client and following the elected master).
"""
