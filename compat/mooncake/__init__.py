"""Mooncake's Python API (``mooncake.store``, ``mooncake.engine``) over mooncake-py.

vLLM's MooncakeStoreConnector and MooncakeConnector, SGLang's HiCache and P/D path and LMCache's
remote backend import these names from the C++ wheel; with this package installed instead they
run unchanged on our store and transfer engine. Calls keep the original's conventions: integer
returns are 0 or a byte count on success and a negative Mooncake code on failure, batch results
are aligned with the keys, and memory is named by raw addresses.
"""
