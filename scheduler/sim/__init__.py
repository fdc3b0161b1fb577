"""The trace simulator: replays a request trace through the conductor with a cost model."""
