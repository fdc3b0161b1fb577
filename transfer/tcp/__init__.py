"""TCP transport: several streams over several NICs, with its own framing and target server."""
