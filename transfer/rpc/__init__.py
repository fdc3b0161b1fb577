"""Control-plane RPC (ZeroMQ + msgpack, and unix:// streams): server and client side by side."""
